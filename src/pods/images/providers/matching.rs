//! Image patterns as upstream's keyring matches them (`URLsMatchStr`):
//! a pattern and an image are both read as schemeless URLs; the host's
//! dot-separated parts must be as many, each matched by the pattern's
//! glob (`*`, `?`, `[a-z]`, as Go's `filepath.Match`); the ports must be
//! equal; the pattern's path must be a prefix of the image's. So
//! `*.registry.io` matches `eu.registry.io/app:1` but neither
//! `registry.io/app` nor `a.b.registry.io/app`.

/// A parsed pattern (a provider's `matchImages` entry, or a key of its
/// answer's `auth`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    host: Vec<String>,
    port: String,
    path: String,
}

/// A pattern no image can match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("empty host")]
    EmptyHost,
    #[error("invalid character {0:?}")]
    Character(char),
    #[error("unterminated character class")]
    Class,
}

impl Pattern {
    /// `host[:port][/path]`, an `http(s)://` scheme dropped as upstream's
    /// keyring drops it.
    pub fn parse(s: &str) -> Result<Pattern, PatternError> {
        let s = s
            .strip_prefix("https://")
            .or_else(|| s.strip_prefix("http://"))
            .unwrap_or(s);
        if let Some(c) = s.chars().find(|c| c.is_whitespace() || c.is_control()) {
            return Err(PatternError::Character(c));
        }
        let (authority, path) = match s.find('/') {
            Some(i) => (&s[..i], &s[i..]),
            None => (s, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => (h, p),
            _ => (authority, ""),
        };
        if host.is_empty() {
            return Err(PatternError::EmptyHost);
        }
        let host: Vec<String> = host.split('.').map(str::to_string).collect();
        for part in &host {
            glob(part, "")?;
        }
        Ok(Pattern {
            host,
            port: port.into(),
            path: path.into(),
        })
    }

    /// Whether `image` (a reference as written in a pod) matches.
    pub fn matches(&self, image: &str) -> bool {
        let Ok(target) = Pattern::parse(image) else {
            return false;
        };
        self.port == target.port
            && self.host.len() == target.host.len()
            && target.path.starts_with(&self.path)
            && self
                .host
                .iter()
                .zip(&target.host)
                .all(|(g, t)| glob(g, t).unwrap_or(false))
    }
}

/// Go's `filepath.Match` on one host part: `*` any run, `?` one
/// character, `[…]` a class (`^` negates, `a-z` ranges). Also checks the
/// pattern: a malformed class is an error whatever the name.
fn glob(pattern: &str, name: &str) -> Result<bool, PatternError> {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Classes checked up front, as Go reports a bad pattern even when an
    // earlier part already failed to match.
    let mut i = 0;
    while i < p.len() {
        if p[i] == '[' {
            i = class_end(&p, i)?;
        }
        i += 1;
    }
    Ok(glob_at(&p, &n))
}

fn glob_at(p: &[char], n: &[char]) -> bool {
    match p.first() {
        None => n.is_empty(),
        Some('*') => (0..=n.len()).any(|k| glob_at(&p[1..], &n[k..])),
        Some('?') => !n.is_empty() && glob_at(&p[1..], &n[1..]),
        Some('[') => {
            let end = class_end(p, 0).unwrap_or(p.len() - 1);
            !n.is_empty() && in_class(&p[1..end], n[0]) && glob_at(&p[end + 1..], &n[1..])
        }
        Some(c) => n.first() == Some(c) && glob_at(&p[1..], &n[1..]),
    }
}

/// The index of the `]` closing the class opened at `start`.
fn class_end(p: &[char], start: usize) -> Result<usize, PatternError> {
    let mut i = start + 1;
    if p.get(i) == Some(&'^') {
        i += 1;
    }
    // A `]` first in the class is a member.
    if p.get(i) == Some(&']') {
        i += 1;
    }
    while i < p.len() {
        if p[i] == ']' {
            return Ok(i);
        }
        i += 1;
    }
    Err(PatternError::Class)
}

fn in_class(class: &[char], c: char) -> bool {
    let (negated, class) = match class.first() {
        Some('^') => (true, &class[1..]),
        _ => (false, class),
    };
    let mut hit = false;
    let mut i = 0;
    while i < class.len() {
        if i + 2 < class.len() && class[i + 1] == '-' {
            hit |= class[i] <= c && c <= class[i + 2];
            i += 3;
        } else {
            hit |= class[i] == c;
            i += 1;
        }
    }
    hit != negated
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, image: &str) -> bool {
        Pattern::parse(pattern).unwrap().matches(image)
    }

    #[test]
    fn hosts_match_part_by_part_as_upstreams_keyring() {
        assert!(m("*.registry.io", "eu.registry.io/app:1"));
        assert!(!m("*.registry.io", "registry.io/app:1"));
        assert!(!m("*.registry.io", "a.b.registry.io/app:1"));
        assert!(m(
            "*.dkr.ecr.*.amazonaws.com",
            "123.dkr.ecr.eu-west-1.amazonaws.com/x"
        ));
        assert!(m("registry.io", "registry.io/team/app@sha256:abc"));
        assert!(m("reg?stry.io", "registry.io/x"));
        assert!(m("[a-c]cr.io", "bcr.io/x") && !m("[a-c]cr.io", "dcr.io/x"));
        assert!(m("[^a]cr.io", "bcr.io/x") && !m("[^a]cr.io", "acr.io/x"));
    }

    #[test]
    fn ports_must_be_equal_and_paths_a_prefix() {
        assert!(m("127.0.0.1:5000", "127.0.0.1:5000/app:1"));
        assert!(!m("127.0.0.1:5000", "127.0.0.1/app:1"));
        assert!(!m("127.0.0.1", "127.0.0.1:5000/app:1"));
        assert!(m("127.0.0.1:5000/team", "127.0.0.1:5000/team/app:1"));
        assert!(!m("127.0.0.1:5000/team", "127.0.0.1:5000/other/app:1"));
        assert!(m("https://registry.io", "registry.io/app"));
    }

    #[test]
    fn malformed_patterns_are_refused() {
        assert_eq!(Pattern::parse(""), Err(PatternError::EmptyHost));
        assert_eq!(Pattern::parse("a b"), Err(PatternError::Character(' ')));
        assert_eq!(Pattern::parse("[a.io"), Err(PatternError::Class));
        assert!(!m("registry.io", "not an image"));
    }
}
