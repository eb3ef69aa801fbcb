//! `kinglet demo`: kinglet's main job on an embedded default, offline. It
//! packs its own (static) executable into an OCI image, drops it into the
//! import directory, writes a static pod that runs `kinglet demo-app` from
//! that image, and runs the agent standalone. `kinglet demo-app` is the
//! tiny program inside: a line a few seconds, a clean exit on SIGTERM.
//! Its files stay under its root dir, and on Ctrl-C its pod and the
//! monitor go with the agent.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use sha2::Digest as _;

/// The demo image's name.
pub fn image_name() -> String {
    format!("kinglet.local/demo:{}", env!("CARGO_PKG_VERSION"))
}

/// Whether an ELF file is statically linked (no program interpreter).
fn is_static(exe: &[u8]) -> bool {
    if exe.len() < 64 || &exe[..4] != b"\x7fELF" {
        return false;
    }
    let is64 = exe[4] == 2;
    let le = exe[5] == 1;
    let rd16 = |o: usize| if le { u16::from_le_bytes([exe[o], exe[o + 1]]) } else { u16::from_be_bytes([exe[o], exe[o + 1]]) } as usize;
    let rd32 = |o: usize| {
        let b = [exe[o], exe[o + 1], exe[o + 2], exe[o + 3]];
        (if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }) as usize
    };
    let rd64 = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&exe[o..o + 8]);
        (if le {
            u64::from_le_bytes(b)
        } else {
            u64::from_be_bytes(b)
        }) as usize
    };
    let (phoff, phentsize, phnum) = if is64 {
        (rd64(0x20), rd16(0x36), rd16(0x38))
    } else {
        (rd32(0x1c), rd16(0x2a), rd16(0x2c))
    };
    (0..phnum).all(|i| {
        let o = phoff + i * phentsize;
        // PT_INTERP = 3
        o + 4 > exe.len() || rd32(o) != 3
    })
}

fn sha(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)))
}

/// Writes an OCI-layout archive holding `exe` as `/kinglet`.
pub fn write_image(exe: &[u8], out: &Path) -> anyhow::Result<()> {
    let mut layer = tar::Builder::new(Vec::new());
    // The mount points a container needs, and the files kinglet binds over.
    for d in ["etc", "proc", "sys", "dev", "tmp"] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(if d == "tmp" { 0o1777 } else { 0o755 });
        h.set_size(0);
        h.set_mtime(0);
        layer.append_data(&mut h, format!("{d}/"), std::io::empty())?;
    }
    for f in ["etc/hosts", "etc/resolv.conf", "etc/hostname"] {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(0);
        h.set_mtime(0);
        layer.append_data(&mut h, f, std::io::empty())?;
    }
    let mut h = tar::Header::new_gnu();
    h.set_size(exe.len() as u64);
    h.set_mode(0o755);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    layer.append_data(&mut h, "kinglet", exe)?;
    let layer = layer.into_inner()?;
    let layer_digest = sha(&layer);
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        a => a,
    };
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": arch, "os": "linux",
        "config": {"Entrypoint": ["/kinglet"], "Cmd": ["demo-app"], "Env": ["PATH=/"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }))?;
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer.len()}],
    }))?;
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(&manifest), "size": manifest.len(),
                       "annotations": {"io.containerd.image.name": image_name()}}],
    }))?;
    let tmp = out.with_extension("part");
    let mut ar = tar::Builder::new(
        std::fs::File::create(&tmp).with_context(|| format!("{}", tmp.display()))?,
    );
    let mut add = |name: String, data: &[u8]| -> std::io::Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        ar.append_data(&mut h, name, data)
    };
    add("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json".into(), &index)?;
    for blob in [&layer, &config, &manifest] {
        add(format!("blobs/sha256/{}", &sha(blob)[7..]), blob)?;
    }
    ar.into_inner()?.flush()?;
    // The import dir picks up files renamed into place.
    std::fs::rename(&tmp, out)?;
    Ok(())
}

/// Prepares `root` for the demo; returns the config file to run with.
pub fn prepare(root: &Path) -> anyhow::Result<std::path::PathBuf> {
    let exe_path = std::env::current_exe()?;
    let exe = std::fs::read(&exe_path)?;
    if !is_static(&exe) {
        anyhow::bail!(
            "the demo packs kinglet itself into its image, so it needs the static build: run `cross/build.sh {}-unknown-linux-musl` and use target/...-musl/release/kinglet",
            std::env::consts::ARCH
        );
    }
    let manifests = root.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    std::fs::create_dir_all(root.join("images/import"))?;
    let index_has_image = std::fs::read_to_string(root.join("images/index.json"))
        .is_ok_and(|s| s.contains(&image_name()));
    if !index_has_image {
        write_image(&exe, &root.join("images/import/kinglet-demo.tar"))?;
    }
    std::fs::write(
        manifests.join("demo.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: demo\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: 5\n  containers:\n  - name: hello\n    image: {}\n    imagePullPolicy: Never\n    resources:\n      limits: {{memory: 16Mi, cpu: 100m}}\n",
            image_name()
        ),
    )?;
    let config = root.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\nfailSwapOn: false\n",
            manifests.display()
        ),
    )?;
    Ok(config)
}

/// Keeps the demo's files under its root dir: the CNI conflist kinglet
/// installs, the pod logs and the device plugins' and pod resources'
/// sockets go there unless the flags name other dirs (the agent's
/// defaults are the host's `/etc/cni/net.d`, `/var/log/pods` and
/// `/var/lib/kubelet/...`).
pub fn keep_under_root(flags: &mut crate::config::flags::Flags) {
    if flags.cni_conf_dir == "/etc/cni/net.d" {
        flags.cni_conf_dir = flags.root_dir.join("cni/net.d").display().to_string();
    }
    if flags.pod_log_dir == Path::new("/var/log/pods") {
        flags.pod_log_dir = flags.root_dir.join("logs");
    }
    if flags.device_plugin_dir == Path::new("/var/lib/kubelet/device-plugins") {
        flags.device_plugin_dir = flags.root_dir.join("device-plugins");
    }
    if flags.pod_resources_dir == Path::new("/var/lib/kubelet/pod-resources") {
        flags.pod_resources_dir = flags.root_dir.join("pod-resources");
    }
}

/// The program inside the demo image.
pub fn app() -> ! {
    let start = std::time::Instant::now();
    // As PID 1 of its PID namespace the process ignores signals it has no
    // handler for, so a thread waits for SIGTERM and the loop exits.
    // SAFETY: block the signals before the thread exists, so both inherit
    // the mask and only sigwait receives them.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let term = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t = term.clone();
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: standard sigwait on a blocked SIGTERM/SIGINT set.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigwait(&set, &mut sig);
        }
        t.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let mut n = 0u64;
    loop {
        if term.load(std::sync::atomic::Ordering::SeqCst) {
            println!("hello from the kinglet demo pod: SIGTERM, bye");
            std::process::exit(0);
        }
        if n.is_multiple_of(50) {
            println!(
                "hello from the kinglet demo pod {} (pid {}, up {}s)",
                host.trim(),
                std::process::id(),
                start.elapsed().as_secs()
            );
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_detection() {
        assert!(!is_static(
            b"not an elf at all, just text padding padding padding padding"
        ));
        // /bin/busybox from busybox-static is static; /bin/ls is not.
        if let Ok(b) = std::fs::read("/bin/busybox") {
            assert!(is_static(&b));
        }
        assert!(!is_static(&std::fs::read("/bin/ls").unwrap()));
    }
}
