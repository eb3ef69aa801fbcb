//! Which manifest of a multi-platform index this node runs: `linux`, the
//! architecture kinglet was built for, and the ARM variant (`v7` on armv7,
//! `v8` or none on arm64), as containerd's platform matcher does.

/// The platform of this build, in OCI terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    pub os: &'static str,
    pub architecture: &'static str,
    pub variant: Option<&'static str>,
}

impl Platform {
    pub fn host() -> Self {
        let (architecture, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", None),
            "aarch64" => ("arm64", Some("v8")),
            "arm" => ("arm", Some("v7")),
            "x86" => ("386", None),
            "riscv64" => ("riscv64", None),
            "powerpc64" => ("ppc64le", None),
            "s390x" => ("s390x", None),
            other => (other, None),
        };
        Platform {
            os: "linux",
            architecture,
            variant,
        }
    }

    /// How well an index entry's platform fits: `None` if it cannot run
    /// here; higher is better (an exact variant beats an absent one).
    pub fn score(&self, os: &str, arch: &str, variant: Option<&str>) -> Option<u8> {
        if os != self.os || arch != self.architecture {
            return None;
        }
        match (self.variant, variant) {
            (_, None) => Some(1),
            (Some(want), Some(have)) if want == have => Some(3),
            // An armv7 machine also runs armv6 and armv5 images.
            (Some("v7"), Some("v6" | "v5")) => Some(2),
            (Some("v8"), Some(_)) => None,
            (None, Some(_)) => Some(1),
            _ => None,
        }
    }

    /// Picks the best of `(digest, os, arch, variant)` candidates.
    pub fn pick<'a>(
        &self,
        candidates: impl IntoIterator<Item = (&'a str, &'a str, &'a str, Option<&'a str>)>,
    ) -> Option<&'a str> {
        candidates
            .into_iter()
            .filter_map(|(d, os, arch, v)| self.score(os, arch, v).map(|s| (s, d)))
            .max_by_key(|(s, _)| *s)
            .map(|(_, d)| d)
    }

    pub fn describe(&self) -> String {
        match self.variant {
            Some(v) => format!("{}/{}/{}", self.os, self.architecture, v),
            None => format!("{}/{}", self.os, self.architecture),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arm_variants() {
        let v7 = Platform {
            os: "linux",
            architecture: "arm",
            variant: Some("v7"),
        };
        let c = [
            ("a", "linux", "arm", Some("v6")),
            ("b", "linux", "arm", Some("v7")),
            ("c", "linux", "arm64", Some("v8")),
        ];
        assert_eq!(v7.pick(c), Some("b"));
        assert_eq!(v7.pick([("a", "linux", "arm", Some("v6"))]), Some("a"));
        let arm64 = Platform {
            os: "linux",
            architecture: "arm64",
            variant: Some("v8"),
        };
        assert_eq!(arm64.pick(c), Some("c"));
        assert_eq!(arm64.pick([("x", "linux", "arm64", None)]), Some("x"));
        let amd64 = Platform {
            os: "linux",
            architecture: "amd64",
            variant: None,
        };
        assert_eq!(amd64.pick(c), None);
        assert_eq!(
            amd64.pick([
                ("w", "windows", "amd64", None),
                ("l", "linux", "amd64", None)
            ]),
            Some("l")
        );
    }
}
