//! The Prometheus text exposition (format 0.0.4) of a [`Scrape`], in
//! cAdvisor's metric names, types and help, its labels in its order
//! (sorted by name: `container`, `cpu`, `device`, `id`, `image`,
//! `interface`, `name`, `namespace`, `pod`, ...), and empty label values
//! written out as cAdvisor writes them. Written by hand, as
//! `/metrics/resource` is: one pass over the series per family, no
//! registry kept between scrapes.

use std::fmt::Write as _;

use super::{Machine, Scrape, Series};

/// A family's samples of one series: (extra labels, value).
type Samples = Vec<(Vec<(&'static str, String)>, f64)>;

/// (name, type, help, the samples of one series).
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Series, &Machine) -> Samples,
);

/// A per-interface or per-device counter: (name, help, its value).
type Counter<T> = (&'static str, &'static str, fn(&T) -> u64);

fn one(v: u64) -> Samples {
    vec![(Vec::new(), v as f64)]
}

fn secs(ns: u64) -> Samples {
    vec![(Vec::new(), ns as f64 / 1e9)]
}

const CPU: &[Family] = &[
    (
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed in seconds.",
        |s, _| {
            vec![(
                vec![("cpu", "total".into())],
                s.stats.cpu.usage_ns as f64 / 1e9,
            )]
        },
    ),
    (
        "container_cpu_user_seconds_total",
        "counter",
        "Cumulative user cpu time consumed in seconds.",
        |s, _| secs(s.stats.cpu.user_ns),
    ),
    (
        "container_cpu_system_seconds_total",
        "counter",
        "Cumulative system cpu time consumed in seconds.",
        |s, _| secs(s.stats.cpu.system_ns),
    ),
    (
        "container_cpu_cfs_periods_total",
        "counter",
        "Number of elapsed enforcement period intervals.",
        |s, _| {
            if s.stats.limits.cpu_quota.is_some() {
                one(s.stats.cpu.periods)
            } else {
                Vec::new()
            }
        },
    ),
    (
        "container_cpu_cfs_throttled_periods_total",
        "counter",
        "Number of throttled period intervals.",
        |s, _| {
            if s.stats.limits.cpu_quota.is_some() {
                one(s.stats.cpu.throttled_periods)
            } else {
                Vec::new()
            }
        },
    ),
    (
        "container_cpu_cfs_throttled_seconds_total",
        "counter",
        "Total time duration the container has been throttled.",
        |s, _| {
            if s.stats.limits.cpu_quota.is_some() {
                secs(s.stats.cpu.throttled_ns)
            } else {
                Vec::new()
            }
        },
    ),
];

const MEMORY: &[Family] = &[
    (
        "container_memory_cache",
        "gauge",
        "Number of bytes of page cache memory.",
        |s, _| one(s.stats.memory.cache),
    ),
    (
        "container_memory_failcnt",
        "counter",
        "Number of memory usage hits limits",
        |s, _| one(s.stats.memory.failcnt),
    ),
    (
        "container_memory_failures_total",
        "counter",
        "Cumulative count of memory allocation failures.",
        |s, _| {
            let m = &s.stats.memory;
            [
                ("pgfault", "container", m.pgfault),
                ("pgfault", "hierarchy", m.hierarchy_pgfault),
                ("pgmajfault", "container", m.pgmajfault),
                ("pgmajfault", "hierarchy", m.hierarchy_pgmajfault),
            ]
            .into_iter()
            .map(|(t, scope, v)| {
                (
                    vec![("failure_type", t.into()), ("scope", scope.into())],
                    v as f64,
                )
            })
            .collect()
        },
    ),
    (
        "container_memory_mapped_file",
        "gauge",
        "Size of memory mapped files in bytes.",
        |s, _| one(s.stats.memory.mapped_file),
    ),
    (
        "container_memory_max_usage_bytes",
        "gauge",
        "Maximum memory usage recorded in bytes",
        |s, _| one(s.stats.memory.max_usage),
    ),
    (
        "container_memory_rss",
        "gauge",
        "Size of RSS in bytes.",
        |s, _| one(s.stats.memory.rss),
    ),
    (
        "container_memory_swap",
        "gauge",
        "Container swap usage in bytes.",
        |s, _| one(s.stats.memory.swap),
    ),
    (
        "container_memory_usage_bytes",
        "gauge",
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
        |s, _| one(s.stats.memory.usage),
    ),
    (
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set in bytes.",
        |s, _| one(s.stats.memory.working_set),
    ),
    (
        "container_oom_events_total",
        "counter",
        "Count of out of memory events observed for the container",
        |s, _| one(s.stats.memory.oom_kills),
    ),
];

/// The per-interface families: (name, help, the counter).
const NETWORK: &[Counter<super::NetDev>] = &[
    (
        "container_network_receive_bytes_total",
        "Cumulative count of bytes received",
        |n| n.rx_bytes,
    ),
    (
        "container_network_receive_errors_total",
        "Cumulative count of errors encountered while receiving",
        |n| n.rx_errors,
    ),
    (
        "container_network_receive_packets_dropped_total",
        "Cumulative count of packets dropped while receiving",
        |n| n.rx_dropped,
    ),
    (
        "container_network_receive_packets_total",
        "Cumulative count of packets received",
        |n| n.rx_packets,
    ),
    (
        "container_network_transmit_bytes_total",
        "Cumulative count of bytes transmitted",
        |n| n.tx_bytes,
    ),
    (
        "container_network_transmit_errors_total",
        "Cumulative count of errors encountered while transmitting",
        |n| n.tx_errors,
    ),
    (
        "container_network_transmit_packets_dropped_total",
        "Cumulative count of packets dropped while transmitting",
        |n| n.tx_dropped,
    ),
    (
        "container_network_transmit_packets_total",
        "Cumulative count of packets transmitted",
        |n| n.tx_packets,
    ),
];

/// The per-device block I/O families: (name, help, the counter).
const DISK_IO: &[Counter<kinglet_runtime::cgstats::IoStats>] = &[
    (
        "container_fs_reads_bytes_total",
        "Cumulative count of bytes read",
        |d| d.read_bytes,
    ),
    (
        "container_fs_reads_total",
        "Cumulative count of reads completed",
        |d| d.reads,
    ),
    (
        "container_fs_writes_bytes_total",
        "Cumulative count of bytes written",
        |d| d.write_bytes,
    ),
    (
        "container_fs_writes_total",
        "Cumulative count of writes completed",
        |d| d.writes,
    ),
];

const FS_AND_TASKS: &[Family] = &[
    (
        "container_fs_limit_bytes",
        "gauge",
        "Number of bytes that can be consumed by the container on this filesystem.",
        |s, m| {
            s.fs_usage
                .map(|_| vec![(vec![("device", m.fs_device.clone())], m.fs_limit as f64)])
                .unwrap_or_default()
        },
    ),
    (
        "container_fs_usage_bytes",
        "gauge",
        "Number of bytes that are consumed by the container on this filesystem.",
        |s, m| {
            s.fs_usage
                .map(|u| vec![(vec![("device", m.fs_device.clone())], u as f64)])
                .unwrap_or_default()
        },
    ),
    (
        "container_file_descriptors",
        "gauge",
        "Number of open file descriptors for the container.",
        |s, _| s.processes.map(|p| one(p.fds)).unwrap_or_default(),
    ),
    (
        "container_processes",
        "gauge",
        "Number of processes running inside the container.",
        |s, _| s.processes.map(|p| one(p.count)).unwrap_or_default(),
    ),
    (
        "container_sockets",
        "gauge",
        "Number of open sockets for the container.",
        |s, _| s.processes.map(|p| one(p.sockets)).unwrap_or_default(),
    ),
    (
        "container_threads",
        "gauge",
        "Number of threads running inside the container",
        |s, _| {
            s.processes
                .map(|_| one(s.stats.tasks.threads))
                .unwrap_or_default()
        },
    ),
    (
        "container_threads_max",
        "gauge",
        "Maximum number of threads allowed inside the container, infinity if value is zero",
        |s, _| {
            s.processes
                .map(|_| one(s.stats.tasks.threads_max))
                .unwrap_or_default()
        },
    ),
];

const SPEC: &[Family] = &[
    (
        "container_spec_cpu_period",
        "gauge",
        "CPU period of the container.",
        |s, _| one(s.stats.limits.cpu_period),
    ),
    (
        "container_spec_cpu_quota",
        "gauge",
        "CPU quota of the container.",
        |s, _| s.stats.limits.cpu_quota.map(one).unwrap_or_default(),
    ),
    (
        "container_spec_cpu_shares",
        "gauge",
        "CPU share of the container.",
        |s, _| one(s.stats.limits.cpu_shares),
    ),
    // Unlimited reads as 0, as cAdvisor writes it.
    (
        "container_spec_memory_limit_bytes",
        "gauge",
        "Memory limit for the container.",
        |s, _| one(s.stats.limits.memory.unwrap_or(0)),
    ),
    (
        "container_spec_memory_reservation_limit_bytes",
        "gauge",
        "Memory reservation limit for the container.",
        |s, _| one(s.stats.limits.memory_reservation.unwrap_or(0)),
    ),
    (
        "container_spec_memory_swap_limit_bytes",
        "gauge",
        "Memory swap limit for the container.",
        |s, _| one(s.stats.limits.swap.unwrap_or(0)),
    ),
    (
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds.",
        |s, _| {
            if s.start_time > 0.0 {
                vec![(Vec::new(), s.start_time)]
            } else {
                Vec::new()
            }
        },
    ),
];

/// The whole page.
pub fn render(s: &Scrape) -> String {
    let mut out = String::new();
    let now = s.at.as_millisecond() as f64 / 1000.0;
    let _ = writeln!(
        out,
        "# HELP cadvisor_version_info A metric with a constant '1' value labeled by kernel version, OS version, docker version, cadvisor version & cadvisor revision."
    );
    let _ = writeln!(out, "# TYPE cadvisor_version_info gauge");
    let _ = writeln!(
        out,
        "cadvisor_version_info{{cadvisorRevision=\"\",cadvisorVersion=\"\",dockerVersion=\"\",kernelVersion=\"{}\",osVersion=\"\"}} 1",
        escape(&s.machine.kernel)
    );
    for f in CPU.iter().chain(MEMORY) {
        family(&mut out, s, f);
    }
    for (name, help, value) in DISK_IO {
        let f = |s: &Series, m: &Machine| -> Samples {
            s.stats
                .io
                .iter()
                .map(|d| {
                    let dev = m.devices.get(&(d.major, d.minor)).cloned();
                    let dev = dev.unwrap_or_else(|| format!("{}:{}", d.major, d.minor));
                    (vec![("device", dev)], value(d) as f64)
                })
                .collect()
        };
        write_family(&mut out, s, name, "counter", help, &f);
    }
    for f in FS_AND_TASKS.iter().chain(SPEC) {
        family(&mut out, s, f);
    }
    write_family(
        &mut out,
        s,
        "container_last_seen",
        "gauge",
        "Last time a container was seen by the exporter",
        &|_, _| vec![(Vec::new(), now)],
    );
    for (name, help, value) in NETWORK {
        let f = |s: &Series, _: &Machine| -> Samples {
            s.network
                .iter()
                .map(|n| (vec![("interface", n.name.clone())], value(n) as f64))
                .collect()
        };
        write_family(&mut out, s, name, "counter", help, &f);
    }
    let _ = writeln!(
        out,
        "# HELP container_scrape_error 1 if there was an error while getting container metrics, 0 otherwise"
    );
    let _ = writeln!(out, "# TYPE container_scrape_error gauge");
    let _ = writeln!(out, "container_scrape_error {}", u8::from(s.error));
    let m = &s.machine;
    let _ = writeln!(out, "# HELP machine_cpu_cores Number of logical CPU cores.");
    let _ = writeln!(out, "# TYPE machine_cpu_cores gauge");
    let _ = writeln!(out, "machine_cpu_cores {}", m.cpu_cores);
    let _ = writeln!(
        out,
        "# HELP machine_memory_bytes Amount of memory installed on the machine."
    );
    let _ = writeln!(out, "# TYPE machine_memory_bytes gauge");
    let _ = writeln!(out, "machine_memory_bytes {}", m.memory_bytes);
    out
}

fn family(out: &mut String, s: &Scrape, (name, kind, help, f): &Family) {
    write_family(out, s, name, kind, help, f);
}

/// A family's header and every series' samples; a family no series has
/// is left out whole, as client_golang leaves it out.
fn write_family(
    out: &mut String,
    s: &Scrape,
    name: &str,
    kind: &str,
    help: &str,
    f: &dyn Fn(&Series, &Machine) -> Samples,
) {
    let mut header = false;
    for series in &s.series {
        for (extra, v) in f(series, &s.machine) {
            if !header {
                let _ = writeln!(out, "# HELP {name} {help}");
                let _ = writeln!(out, "# TYPE {name} {kind}");
                header = true;
            }
            let _ = writeln!(out, "{name}{} {v}", labels(series, extra));
        }
    }
}

/// The series' labels and the family's, sorted by name.
fn labels(s: &Series, extra: Vec<(&'static str, String)>) -> String {
    let mut all: Vec<(&str, &str)> = vec![
        ("container", &s.container),
        ("id", &s.id),
        ("image", &s.image),
        ("name", &s.name),
        ("namespace", &s.namespace),
        ("pod", &s.pod),
    ];
    all.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
    all.sort_by_key(|(k, _)| *k);
    let inner: Vec<String> = all
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// A label value escaped as the text format wants.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
