use std::path::Path;

use super::*;

fn write(p: &Path, text: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// A v2 tree with one pod of two containers (one of them gone), a
/// process of the first in `proc`, and the pods' QoS levels.
fn v2_node(dir: &Path) -> Inputs {
    let cg = dir.join("cg");
    write(&cg.join("cgroup.controllers"), "cpu memory pids io");
    let pod = cg.join("kubepods/burstable/poduid1");
    write(&pod.join("cpu.stat"), "usage_usec 3000000\n");
    write(&pod.join("memory.current"), "5000\n");
    write(
        &pod.join("c1/cpu.stat"),
        "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
    );
    write(&pod.join("c1/memory.current"), "4096\n");
    write(
        &pod.join("c1/memory.stat"),
        "anon 3000\nfile 1000\ninactive_file 96\n",
    );
    write(&pod.join("c1/cgroup.procs"), "4242\n");
    write(
        &pod.join("c1/io.stat"),
        "8:0 rbytes=10 wbytes=20 rios=1 wios=2\n",
    );
    write(&pod.join("sandbox1/cgroup.procs"), "4241\n");
    write(&cg.join("kubepods/cpu.stat"), "usage_usec 9000000\n");
    std::fs::create_dir_all(cg.join("kubepods/besteffort")).unwrap();
    let proc = dir.join("proc");
    write(
        &proc.join("4242/net/dev"),
        "h1\nh2\n    lo: 1 1 0 0 0 0 0 0 1 1 0 0 0 0 0 0\n  eth0: 700 7 1 2 0 0 0 0 900 9 3 4 0 0 0 0\n",
    );
    std::fs::create_dir_all(proc.join("4242/ns")).unwrap();
    std::os::unix::fs::symlink("net:[1]", proc.join("4242/ns/net")).unwrap();
    std::fs::create_dir_all(proc.join("self/ns")).unwrap();
    std::os::unix::fs::symlink("net:[0]", proc.join("self/ns/net")).unwrap();
    std::fs::create_dir_all(proc.join("4242/fd")).unwrap();
    std::os::unix::fs::symlink("/dev/null", proc.join("4242/fd/0")).unwrap();
    std::os::unix::fs::symlink("socket:[77]", proc.join("4242/fd/3")).unwrap();
    Inputs {
        cgroup_root: cg,
        proc_dir: proc,
        pods_cgroup: "kubepods".into(),
        pods: vec![PodRef {
            uid: "uid1".into(),
            namespace: "ns".into(),
            name: "web".into(),
            cgroup: "kubepods/burstable/poduid1".into(),
            start_time: 1_700_000_000.0,
            own_network: true,
        }],
        containers: vec![
            ContainerRef {
                id: "c1".into(),
                pod_uid: "uid1".into(),
                name: "app".into(),
                image: "registry.test/app:1".into(),
                started_at: 1_700_000_001.5,
                writable_layer: Some(12_288),
            },
            ContainerRef {
                id: "c0".into(),
                pod_uid: "uid1".into(),
                name: "app".into(),
                ..ContainerRef::default()
            },
        ],
        node_cpu_nanos: 50_000_000_000,
        node_memory: (8 << 30, 6 << 30),
    }
}

#[test]
fn series_are_the_root_the_qos_levels_each_pod_and_its_live_containers() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = v2_node(dir.path());
    let series = collect(&inputs);
    let ids: Vec<&str> = series.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "/",
            "/kubepods",
            "/kubepods/burstable",
            "/kubepods/besteffort",
            "/kubepods/burstable/poduid1",
            "/kubepods/burstable/poduid1/c1"
        ]
    );
    let root = &series[0];
    assert_eq!(root.stats.cpu.usage_ns, 50_000_000_000);
    assert_eq!(root.stats.memory.working_set, 6 << 30);
    assert_eq!(root.processes, None);
    let pod = &series[4];
    assert_eq!(
        (
            pod.pod.as_str(),
            pod.namespace.as_str(),
            pod.container.as_str()
        ),
        ("web", "ns", "")
    );
    // The pod counts its containers' processes and the sandbox's.
    assert_eq!(pod.processes.unwrap().count, 2);
    assert_eq!(pod.network.len(), 1);
    assert_eq!(
        (pod.network[0].rx_bytes, pod.network[0].tx_dropped),
        (700, 4)
    );
    let c = &series[5];
    assert_eq!((c.container.as_str(), c.name.as_str()), ("app", "c1"));
    assert_eq!(c.stats.memory.working_set, 4000);
    assert_eq!(
        c.processes,
        Some(Processes {
            count: 1,
            fds: 2,
            sockets: 1
        })
    );
    assert_eq!(c.fs_usage, Some(12_288));
    assert!(c.network.is_empty(), "network is the pod's");
}

#[test]
fn a_host_network_pod_has_no_network_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let mut inputs = v2_node(dir.path());
    inputs.pods[0].own_network = false;
    assert!(collect(&inputs)[4].network.is_empty());
    // Nor one whose process shares the host's namespace.
    let dir = tempfile::tempdir().unwrap();
    let mut inputs = v2_node(dir.path());
    std::fs::remove_file(inputs.proc_dir.join("self/ns/net")).unwrap();
    std::os::unix::fs::symlink("net:[1]", inputs.proc_dir.join("self/ns/net")).unwrap();
    inputs.pods[0].own_network = true;
    assert!(collect(&inputs)[4].network.is_empty());
}

#[test]
fn the_page_has_cadvisors_names_types_and_sorted_labels() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = v2_node(dir.path());
    let mut machine = Machine {
        cpu_cores: 2,
        memory_bytes: 8 << 30,
        kernel: "6.1.0".into(),
        fs_device: "/dev/vda".into(),
        fs_limit: 1 << 40,
        ..Machine::default()
    };
    machine.devices.insert((8, 0), "/dev/sda".into());
    let page = text::render(&Scrape {
        at: jiff::Timestamp::from_second(1_700_000_100).unwrap(),
        machine,
        series: collect(&inputs),
        error: false,
    });
    let c = r#"container="app",id="/kubepods/burstable/poduid1/c1",image="registry.test/app:1",name="c1",namespace="ns",pod="web""#;
    let p = r#"container="",id="/kubepods/burstable/poduid1",image="",name="",namespace="ns",pod="web""#;
    for want in [
        "# TYPE container_cpu_usage_seconds_total counter".to_string(),
        r#"container_cpu_usage_seconds_total{container="app",cpu="total",id="/kubepods/burstable/poduid1/c1",image="registry.test/app:1",name="c1",namespace="ns",pod="web"} 2.5"#.to_string(),
        format!("container_cpu_user_seconds_total{{{c}}} 2"),
        format!("container_memory_working_set_bytes{{{c}}} 4000"),
        format!("container_memory_rss{{{c}}} 3000"),
        format!("container_memory_cache{{{c}}} 1000"),
        r#"container_fs_usage_bytes{container="app",device="/dev/vda",id="/kubepods/burstable/poduid1/c1",image="registry.test/app:1",name="c1",namespace="ns",pod="web"} 12288"#.to_string(),
        r#"container_fs_writes_bytes_total{container="app",device="/dev/sda",id="/kubepods/burstable/poduid1/c1",image="registry.test/app:1",name="c1",namespace="ns",pod="web"} 20"#.to_string(),
        format!("container_processes{{{c}}} 1"),
        format!("container_sockets{{{c}}} 1"),
        format!("container_start_time_seconds{{{c}}} 1700000001.5"),
        format!("container_start_time_seconds{{{p}}} 1700000000"),
        r#"container_network_receive_bytes_total{container="",id="/kubepods/burstable/poduid1",image="",interface="eth0",name="",namespace="ns",pod="web"} 700"#.to_string(),
        format!("container_memory_working_set_bytes{{{p}}} 5000"),
        r#"container_memory_working_set_bytes{container="",id="/",image="",name="",namespace="",pod=""} 6442450944"#.to_string(),
        format!("container_last_seen{{{c}}} 1700000100"),
        "container_scrape_error 0".to_string(),
        "machine_cpu_cores 2".to_string(),
        "machine_memory_bytes 8589934592".to_string(),
        r#"cadvisor_version_info{cadvisorRevision="",cadvisorVersion="",dockerVersion="",kernelVersion="6.1.0",osVersion=""} 1"#.to_string(),
    ] {
        assert!(page.lines().any(|l| l == want), "no line {want} in\n{page}");
    }
    // No quota set anywhere: no CFS families at all.
    assert!(!page.contains("container_cpu_cfs_periods_total"), "{page}");
    // Every sample's family has its HELP and TYPE, once.
    let mut seen = std::collections::BTreeSet::new();
    for l in page.lines().filter(|l| l.starts_with("# TYPE ")) {
        assert!(
            seen.insert(l.split_whitespace().nth(2).unwrap().to_string()),
            "{l} twice"
        );
    }
    for l in page.lines().filter(|l| !l.starts_with('#')) {
        let name = l.split(['{', ' ']).next().unwrap();
        assert!(seen.contains(name), "{name} has no TYPE");
    }
}

#[test]
fn mount_sources_and_block_devices_as_the_kernel_lists_them() {
    let mi = "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n30 22 0:25 / /var/lib/kinglet rw - tmpfs tmpfs rw\n31 22 0:26 / /var/lib/kinglet-images rw - xfs /dev/vdb rw\n";
    assert_eq!(
        mount_source(mi, Path::new("/var/lib/kinglet/images")).as_deref(),
        Some("tmpfs")
    );
    assert_eq!(
        mount_source(mi, Path::new("/var/lib/kinglet-images/x")).as_deref(),
        Some("/dev/vdb")
    );
    assert_eq!(
        mount_source(mi, Path::new("/srv")).as_deref(),
        Some("/dev/vda")
    );
    assert_eq!(mount_source("garbage", Path::new("/")), None);
    let sys = tempfile::tempdir().unwrap();
    write(
        &sys.path().join("dev/block/254:0/uevent"),
        "MAJOR=254\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk\n",
    );
    write(&sys.path().join("dev/block/bad/uevent"), "DEVNAME=x\n");
    let d = block_devices(sys.path());
    assert_eq!(d.len(), 1);
    assert_eq!(d[&(254, 0)], "/dev/vda");
}
