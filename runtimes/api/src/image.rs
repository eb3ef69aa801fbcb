//! Image names and pull credentials, runtime-neutral: what the pod
//! lifecycle needs to know of an image reference (its registry, the
//! default pull policy) and of `kubernetes.io/dockerconfigjson` pull
//! secrets, whichever runtime pulls.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Deserialize;

use crate::PullAuth;

/// A parsed, normalized image reference (docker's rules: `busybox` is
/// `docker.io/library/busybox:latest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageName {
    pub registry: String,
    pub repository: String,
    /// `latest` when neither a tag nor a digest is given.
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl ImageName {
    /// The normalized reference: `registry/repository:tag`, or
    /// `registry/repository@digest` when it names a digest (as image stores
    /// list their tags and digests).
    pub fn canonical(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => format!("{}/{}@{d}", self.registry, self.repository),
            (None, t) => format!(
                "{}/{}:{}",
                self.registry,
                self.repository,
                t.as_deref().unwrap_or("latest")
            ),
        }
    }
}

/// A reference that is not valid (upstream's `InvalidImageName`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid image name {name:?}: {message}")]
pub struct InvalidImageName {
    pub name: String,
    pub message: String,
}

/// Parses and normalizes an image reference.
pub fn parse(name: &str) -> Result<ImageName, InvalidImageName> {
    let bad = |message: &str| InvalidImageName {
        name: name.into(),
        message: message.into(),
    };
    if name.is_empty() || name.len() > 4096 || name.trim() != name {
        return Err(bad("invalid reference format"));
    }
    let (rest, digest) = match name.split_once('@') {
        Some((r, d)) if valid_digest(d) => (r, Some(d.to_string())),
        Some(_) => return Err(bad("invalid digest")),
        None => (name, None),
    };
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (path, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if tag.is_some_and(|t| !valid_tag(t)) {
        return Err(bad("invalid tag"));
    }
    let mut parts: Vec<&str> = path.split('/').collect();
    let registry = if parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost")
    {
        let host = parts.remove(0);
        if !valid_host(host) {
            return Err(bad("invalid registry host"));
        }
        host.to_string()
    } else {
        "docker.io".to_string()
    };
    if parts.is_empty() || !parts.iter().all(|c| valid_component(c)) {
        return Err(bad(
            "repository name must be lowercase alphanumerics separated by '.', '_', '-' or '/'",
        ));
    }
    let mut repository = parts.join("/");
    if registry == "docker.io" && parts.len() == 1 {
        repository = format!("library/{repository}");
    }
    if repository.len() > 255 {
        return Err(bad("repository name too long"));
    }
    Ok(ImageName {
        registry,
        repository,
        tag: tag
            .map(String::from)
            .or_else(|| digest.is_none().then(|| "latest".into())),
        digest,
    })
}

/// `sha256:` and 64 lower-case hex digits, or `sha512:` and 128.
fn valid_digest(d: &str) -> bool {
    let Some((algo, hex)) = d.split_once(':') else {
        return false;
    };
    let len = match algo {
        "sha256" => 64,
        "sha512" => 128,
        _ => return false,
    };
    hex.len() == len
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn valid_tag(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 128
        && t.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// A registry host: DNS labels or a bracketed IPv6 address, with an
/// optional numeric port.
fn valid_host(host: &str) -> bool {
    let (h, port) = match host.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || host.starts_with('[') => (h, Some(p)),
        _ => (host, None),
    };
    let host_ok = if let Some(inner) = h.strip_prefix('[') {
        inner
            .strip_suffix(']')
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
    } else {
        !h.is_empty()
            && h.split('.')
                .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    };
    host_ok && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// One path component of a repository: lower-case alphanumerics, with
/// `.`, `_`, `-` between them (no `..`, no `___`).
fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_lowercase() | b[0].is_ascii_digit()
        && b[b.len() - 1].is_ascii_lowercase() | b[b.len() - 1].is_ascii_digit()
        && c.bytes()
            .all(|x| x.is_ascii_lowercase() || x.is_ascii_digit() || b"._-".contains(&x))
        && !c.contains("..")
        && !c.contains("___")
}

/// The pull policy the kubelet applies when a container names none:
/// `Always` for `:latest` or no tag (and no digest), else `IfNotPresent`.
pub fn default_pull_policy(image: &str) -> &'static str {
    match parse(image) {
        Ok(r) if r.digest.is_none() && r.tag.as_deref().is_none_or(|t| t == "latest") => "Always",
        _ => "IfNotPresent",
    }
}

/// One `.dockerconfigjson` pull secret.
#[derive(Debug, Default, Deserialize)]
pub struct DockerConfig {
    #[serde(default)]
    pub auths: BTreeMap<String, DockerAuth>,
}

#[derive(Debug, Default, Deserialize)]
pub struct DockerAuth {
    #[serde(default)]
    pub auth: Option<String>,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
}

/// The registry key a dockerconfig entry is for: `https://index.docker.io/v1/`
/// is docker.io, `reg.local:5000/path` is `reg.local:5000`.
fn auth_key_host(key: &str) -> String {
    let k = key.split_once("://").map_or(key, |(_, rest)| rest);
    let host = k.split('/').next().unwrap_or(k);
    match host {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".into()
        }
        h => h.to_string(),
    }
}

/// Credentials for `registry` from pull secrets (each the raw
/// `.dockerconfigjson` value), in order, as the kubelet tries them.
pub fn credentials_from_secrets(secrets: &[Vec<u8>], registry: &str) -> Vec<PullAuth> {
    let mut out = Vec::new();
    for raw in secrets {
        let Ok(cfg) = serde_json::from_slice::<DockerConfig>(raw) else {
            continue;
        };
        for (key, a) in cfg.auths {
            if auth_key_host(&key) != registry {
                continue;
            }
            if let (Some(u), Some(p)) = (&a.username, &a.password) {
                out.push(PullAuth {
                    username: u.clone(),
                    password: p.clone(),
                });
            } else if let Some(enc) = &a.auth {
                let Ok(dec) = base64::engine::general_purpose::STANDARD.decode(enc.trim()) else {
                    continue;
                };
                if let Some((u, p)) = String::from_utf8_lossy(&dec).split_once(':') {
                    out.push(PullAuth {
                        username: u.into(),
                        password: p.into(),
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalize_as_docker_does() {
        let n = parse("busybox").unwrap();
        assert_eq!(
            (n.registry.as_str(), n.repository.as_str(), n.tag.as_deref()),
            ("docker.io", "library/busybox", Some("latest"))
        );
        let n = parse("127.0.0.1:5000/a/b:1.2").unwrap();
        assert_eq!(
            (n.registry.as_str(), n.repository.as_str()),
            ("127.0.0.1:5000", "a/b")
        );
        for bad in ["", "UPPER", "a:b:c", " busybox", "a@sha256:12"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn default_pull_policy_follows_the_tag() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("busybox:1.36"), "IfNotPresent");
        assert_eq!(
            default_pull_policy(&format!("busybox@sha256:{}", "b".repeat(64))),
            "IfNotPresent"
        );
    }

    #[test]
    fn pull_secrets_match_the_registry() {
        let a = br#"{"auths":{"https://index.docker.io/v1/":{"auth":"dTpw"},"reg.local:5000":{"username":"x","password":"y"}}}"#;
        let hub = credentials_from_secrets(&[a.to_vec()], "docker.io");
        assert_eq!(
            (hub[0].username.as_str(), hub[0].password.as_str()),
            ("u", "p")
        );
        assert_eq!(
            credentials_from_secrets(&[a.to_vec()], "reg.local:5000")[0].username,
            "x"
        );
        assert!(credentials_from_secrets(&[a.to_vec(), b"garbage".to_vec()], "quay.io").is_empty());
    }
}
