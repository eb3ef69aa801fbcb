//! Registry settings and credentials: the registry configuration file
//! (mirrors, plain HTTP, CA, credentials per registry, in the spirit of k3s's
//! `registries.yaml`) and `kubernetes.io/dockerconfigjson` pull secrets.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// `registries.yaml`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RegistriesConfig {
    /// Registry host (`docker.io`, `registry.local:5000`) → mirrors tried first.
    #[serde(default)]
    pub mirrors: BTreeMap<String, Mirror>,
    /// Registry or mirror host → how to talk to it.
    #[serde(default)]
    pub configs: BTreeMap<String, HostConfig>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Mirror {
    /// `https://host[:port]` or `http://host[:port]`, in order.
    pub endpoint: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    #[serde(default)]
    pub auth: Option<Credentials>,
    #[serde(default)]
    pub tls: Option<Tls>,
    /// Speak plain HTTP to this host.
    #[serde(default)]
    pub plain_http: bool,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    /// PEM CA bundle trusted for this host (in addition to the system's).
    #[serde(default)]
    pub ca_file: Option<String>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

/// Where one pull goes: host, scheme and how to authenticate.
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    pub host: String,
    pub plain_http: bool,
    pub ca_pem: Option<Vec<u8>>,
    pub insecure: bool,
}

/// What is wrong with `registries.yaml`, or with a CA file it names.
#[derive(Debug, thiserror::Error)]
pub enum RegistriesError {
    #[error("{}: {source}", path.display())]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Parse {
        path: std::path::PathBuf,
        source: Box<serde_saphyr::Error>,
    },
    /// A `tls.ca_file` that cannot be read, at start.
    #[error("{}: configs.{host}.tls.ca_file: {file}: {source}", path.display())]
    CaFile {
        path: std::path::PathBuf,
        host: String,
        file: String,
        source: std::io::Error,
    },
    /// The same, at a pull (the file went since).
    #[error("registry {host}: ca_file {file}: {source}")]
    CaFileGone {
        host: String,
        file: String,
        source: std::io::Error,
    },
}

impl RegistriesConfig {
    /// Reads the file; a missing file means no configuration.
    pub fn load(path: &Path) -> Result<Self, RegistriesError> {
        match std::fs::read_to_string(path) {
            Ok(text) if text.trim().is_empty() => Ok(Self::default()),
            Ok(text) => {
                let cfg: Self =
                    serde_saphyr::from_str(&text).map_err(|e| RegistriesError::Parse {
                        path: path.into(),
                        source: Box::new(e),
                    })?;
                cfg.check_files(path)?;
                Ok(cfg)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(RegistriesError::Read {
                path: path.into(),
                source,
            }),
        }
    }

    /// Every `tls.ca_file` named must be readable now, so that a typo is
    /// said at start, not at the first pull.
    fn check_files(&self, path: &Path) -> Result<(), RegistriesError> {
        for (host, c) in &self.configs {
            if let Some(f) = c.tls.as_ref().and_then(|t| t.ca_file.as_ref()) {
                std::fs::File::open(f).map_err(|source| RegistriesError::CaFile {
                    path: path.into(),
                    host: host.clone(),
                    file: f.clone(),
                    source,
                })?;
            }
        }
        Ok(())
    }

    /// The endpoints to try for `registry`, mirrors first. Hosts on loopback
    /// speak plain HTTP unless configured otherwise, as containerd allows.
    pub fn endpoints(&self, registry: &str) -> Result<Vec<Endpoint>, RegistriesError> {
        let mut out = Vec::new();
        if let Some(m) = self.mirrors.get(registry) {
            for e in &m.endpoint {
                let (plain, host) = match e.split_once("://") {
                    Some(("http", h)) => (true, h),
                    Some(("https", h)) => (false, h),
                    _ => (false, e.as_str()),
                };
                let host = host.trim_end_matches('/');
                out.push(self.endpoint(host, Some(plain))?);
            }
        }
        let direct = self.endpoint(registry, None)?;
        if direct.plain_http && !self.configs.get(registry).is_some_and(|c| c.plain_http) {
            // Loopback without configuration: HTTPS first, then plain HTTP,
            // as docker treats 127.0.0.0/8 and containerd localhost.
            out.push(Endpoint {
                plain_http: false,
                ..direct.clone()
            });
        }
        out.push(direct);
        Ok(out)
    }

    fn endpoint(&self, host: &str, plain: Option<bool>) -> Result<Endpoint, RegistriesError> {
        let cfg = self.configs.get(host).cloned().unwrap_or_default();
        let ca_pem = match cfg.tls.as_ref().and_then(|t| t.ca_file.as_ref()) {
            Some(f) => Some(
                std::fs::read(f).map_err(|source| RegistriesError::CaFileGone {
                    host: host.into(),
                    file: f.clone(),
                    source,
                })?,
            ),
            None => None,
        };
        Ok(Endpoint {
            host: host.to_string(),
            plain_http: plain.unwrap_or(false)
                || cfg.plain_http
                || (cfg.tls.is_none() && is_loopback(host)),
            ca_pem,
            insecure: cfg.tls.as_ref().is_some_and(|t| t.insecure_skip_verify),
        })
    }

    /// Credentials configured for `host`.
    pub fn credentials(&self, host: &str) -> Option<Credentials> {
        self.configs.get(host).and_then(|c| c.auth.clone())
    }
}

/// Whether `host[:port]` names this machine.
pub fn is_loopback(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name == "localhost"
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "[::1]:5000",
        ] {
            assert!(is_loopback(h), "{h}");
        }
        for h in [
            "docker.io",
            "10.0.0.1:5000",
            "registry.local:5000",
            "[2001:db8::1]:443",
        ] {
            assert!(!is_loopback(h), "{h}");
        }
    }

    #[test]
    fn a_missing_ca_file_is_refused_at_load() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("registries.yaml");
        std::fs::write(
            &f,
            "configs:\n  reg.local:\n    tls: {ca_file: /nonexistent/ca.pem}\n",
        )
        .unwrap();
        let e = RegistriesConfig::load(&f).unwrap_err().to_string();
        assert!(
            e.contains("configs.reg.local.tls.ca_file: /nonexistent/ca.pem"),
            "{e}"
        );
        std::fs::write(d.path().join("ca.pem"), "x").unwrap();
        let ok = format!(
            "configs:\n  reg.local:\n    tls: {{ca_file: {}}}\n",
            d.path().join("ca.pem").display()
        );
        std::fs::write(&f, ok).unwrap();
        assert!(RegistriesConfig::load(&f).is_ok());
    }

    #[test]
    fn registries_yaml() {
        let cfg: RegistriesConfig = serde_saphyr::from_str(
            "mirrors:\n  docker.io:\n    endpoint: [\"http://10.0.0.5:5000\", \"https://mirror.example\"]\nconfigs:\n  mirror.example:\n    auth: {username: u, password: p}\n  reg.local:5443:\n    tls: {insecure_skip_verify: true}\n",
        )
        .unwrap();
        let e = cfg.endpoints("docker.io").unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(
            (e[0].host.as_str(), e[0].plain_http),
            ("10.0.0.5:5000", true)
        );
        assert_eq!(
            (e[1].host.as_str(), e[1].plain_http),
            ("mirror.example", false)
        );
        assert_eq!(e[2].host, "docker.io");
        assert_eq!(cfg.credentials("mirror.example").unwrap().username, "u");
        let r = cfg.endpoints("reg.local:5443").unwrap();
        assert!(r[0].insecure && !r[0].plain_http);
        let local = cfg.endpoints("127.0.0.1:5000").unwrap();
        assert_eq!(
            local.iter().map(|e| e.plain_http).collect::<Vec<_>>(),
            [false, true]
        );
        assert!(serde_saphyr::from_str::<RegistriesConfig>("mirors: {}\n").is_err());
    }
}
