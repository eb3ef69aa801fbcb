//! A real OCI registry (Debian's `docker-registry`, distribution 2.8) on a
//! private loopback port and directory, optionally with TLS from the test
//! CA and htpasswd basic auth. Killed and removed on drop.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Registry {
    pub dir: tempfile::TempDir,
    pub host: String,
    pub tls: bool,
    pub auth: Option<(String, String)>,
    child: Child,
}

/// A certificate and key for 127.0.0.1 signed by a CA made for this test.
pub fn tls_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let st = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "openssl {args:?}");
    };
    run(&[
        "req",
        "-x509",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-subj",
        "/CN=registry-test-ca",
        "-days",
        "2",
        "-out",
        "ca.crt",
    ]);
    run(&[
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "tls.key",
        "-subj",
        "/CN=127.0.0.1",
        "-out",
        "tls.csr",
    ]);
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "tls.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-set_serial",
        "7",
        "-days",
        "2",
        "-extfile",
        "ext",
        "-out",
        "tls.crt",
    ]);
    (dir.join("ca.crt"), dir.join("tls.crt"), dir.join("tls.key"))
}

impl Registry {
    pub fn start(tls: bool, auth: Option<(&str, &str)>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = super::free_port();
        let host = format!("127.0.0.1:{port}");
        let mut cfg = format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
            dir.path().join("data").display()
        );
        if tls {
            let (_, crt, key) = tls_files(dir.path());
            cfg.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                crt.display(),
                key.display()
            ));
        }
        if let Some((u, p)) = auth {
            let out = Command::new("htpasswd")
                .args(["-Bbn", u, p])
                .output()
                .expect("htpasswd");
            std::fs::write(dir.path().join("htpasswd"), out.stdout).unwrap();
            cfg.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: kinglet-test\n    path: {}\n",
                dir.path().join("htpasswd").display()
            ));
        }
        std::fs::write(dir.path().join("config.yml"), cfg).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let mut r = Registry {
            dir,
            host,
            tls,
            auth: auth.map(|(u, p)| (u.into(), p.into())),
            child,
        };
        let start = Instant::now();
        while !r.answers_http() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "registry did not start:\n{}",
                r.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    /// Whether an HTTP server answers on the registry's port: a TCP connect
    /// alone can succeed with nothing listening (a socket connected to
    /// itself when the kernel picks the same port as its source), and a
    /// registry that exited must fail the wait, not the first push.
    fn answers_http(&mut self) -> bool {
        use std::io::{Read, Write};
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("docker-registry exited ({status}):\n{}", self.log());
        }
        let Ok(mut c) = std::net::TcpStream::connect(&self.host) else {
            return false;
        };
        let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
        // A TLS registry answers a plain request with an HTTP 400 too.
        if c.write_all(b"GET /v2/ HTTP/1.0\r\n\r\n").is_err() {
            return false;
        }
        let mut head = [0u8; 5];
        c.read_exact(&mut head).is_ok() && &head == b"HTTP/"
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// skopeo flags to push here.
    pub fn push_flags(&self) -> Vec<String> {
        let mut f = Vec::new();
        if self.tls {
            let certs = self.dir.path().join("skopeo-certs");
            std::fs::create_dir_all(&certs).unwrap();
            std::fs::copy(self.ca(), certs.join("ca.crt")).unwrap();
            f.push(format!("--dest-cert-dir={}", certs.display()));
        } else {
            f.push("--dest-tls-verify=false".into());
        }
        if let Some((u, p)) = &self.auth {
            f.push(format!("--dest-creds={u}:{p}"));
        }
        f
    }

    /// Pushes `tag` of an OCI layout (all platforms) as `repo:tag`.
    pub fn push(&self, layout: &Path, tag: &str, repo: &str) -> String {
        let dest = format!("docker://{}/{repo}:{tag}", self.host);
        let flags = self.push_flags();
        let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
        args.push("--all");
        super::oci::skopeo_copy(&format!("oci:{}:{tag}", layout.display()), &dest, &args);
        format!("{}/{repo}:{tag}", self.host)
    }

    /// The file holding a blob in the registry's storage.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// How many times the registry served a GET of this blob.
    pub fn blob_gets(&self, digest: &str) -> usize {
        self.log()
            .lines()
            .filter(|l| {
                l.contains("GET")
                    && l.contains(&format!("/blobs/{digest}"))
                    && l.contains("response completed")
            })
            .count()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- registry log ---\n{}", self.log());
        }
    }
}
