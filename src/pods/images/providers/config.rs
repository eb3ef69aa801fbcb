//! The `CredentialProviderConfig` file (`kubelet.config.k8s.io/v1`) of
//! `--image-credential-provider-config`, read strictly and validated as
//! upstream's `validateCredentialProviderConfig`: every error names the
//! file and the field.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::config::GoDuration;

/// The config versions upstream reads.
const CONFIG_VERSIONS: &[&str] = &[
    "kubelet.config.k8s.io/v1",
    "kubelet.config.k8s.io/v1beta1",
    "kubelet.config.k8s.io/v1alpha1",
];

/// The exec API versions a provider may speak.
pub const PLUGIN_VERSIONS: &[&str] = &[
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
];

/// The file.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderConfig {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub providers: Vec<Provider>,
}

/// One exec plugin.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Provider {
    pub name: String,
    #[serde(default)]
    pub match_images: Vec<String>,
    pub default_cache_duration: Option<GoDuration>,
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<EnvVar>,
    pub token_attributes: Option<TokenAttributes>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

/// A service account token for the plugin (upstream's
/// `KubeletServiceAccountTokenForCredentialProviders`, beta in 1.34).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenAttributes {
    pub service_account_token_audience: String,
    pub require_service_account: Option<bool>,
    #[serde(default)]
    pub required_service_account_annotation_keys: Vec<String>,
    #[serde(default)]
    pub optional_service_account_annotation_keys: Vec<String>,
    /// `ServiceAccount` or `Token`: what the plugin's answers are cached
    /// by (required from 1.35).
    #[serde(default)]
    pub cache_type: String,
}

/// A provider config that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ProviderConfigError {
    #[error("cannot read credential provider config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("credential provider config {path}: {field}: {message}")]
    Field {
        path: PathBuf,
        field: String,
        message: String,
    },
    #[error("plugin binary directory {0} did not exist")]
    BinDir(PathBuf),
    #[error("plugin binary executable {0} did not exist")]
    Binary(PathBuf),
}

impl ProviderConfig {
    /// Reads and validates the file.
    pub fn load(path: &Path) -> Result<ProviderConfig, ProviderConfigError> {
        let err = |field: String, message: String| ProviderConfigError::Field {
            path: path.into(),
            field,
            message,
        };
        let text = crate::fsutil::read_at_most(path, 1 << 20)
            .map_err(|source| ProviderConfigError::Read {
                path: path.into(),
                source,
            })?
            .ok_or_else(|| err("(document)".into(), "larger than 1 MiB".into()))?;
        let text = String::from_utf8_lossy(&text);
        let tree: serde_json::Value =
            serde_saphyr::from_str(&text).map_err(|e| err("(document)".into(), e.to_string()))?;
        let cfg: ProviderConfig = serde_path_to_error::deserialize(tree)
            .map_err(|e| err(e.path().to_string(), e.into_inner().to_string()))?;
        cfg.validate().map_err(|(f, m)| err(f, m))?;
        Ok(cfg)
    }

    /// Upstream's checks, as (field, message).
    fn validate(&self) -> Result<(), (String, String)> {
        let bad = |f: &str, m: &str| Err((f.to_string(), m.to_string()));
        if !CONFIG_VERSIONS.contains(&self.api_version.as_str()) {
            return bad("apiVersion", "must be kubelet.config.k8s.io/v1");
        }
        if self.kind != "CredentialProviderConfig" {
            return bad("kind", "must be CredentialProviderConfig");
        }
        if self.providers.is_empty() {
            return bad("providers", "at least 1 item in plugins is required");
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, p) in self.providers.iter().enumerate() {
            p.validate()
                .map_err(|(f, m)| (format!("providers[{i}].{f}"), m))?;
            if !seen.insert(&p.name) {
                return Err((format!("providers[{i}].name"), "duplicate name".into()));
            }
        }
        Ok(())
    }
}

impl Provider {
    fn validate(&self) -> Result<(), (String, String)> {
        let bad = |f: &str, m: String| Err((f.to_string(), m));
        let n = self.name.as_str();
        if n.is_empty() {
            return bad("name", "name is required".into());
        }
        if n.contains(['/', '\\', ' ']) || n == "." || n == ".." {
            return bad("name", format!("{n:?}: a file name of the bin dir"));
        }
        if self.match_images.is_empty() {
            return bad(
                "matchImages",
                "at least 1 item in matchImages is required".into(),
            );
        }
        for (i, m) in self.match_images.iter().enumerate() {
            if let Err(e) = super::matching::Pattern::parse(m) {
                return bad(&format!("matchImages[{i}]"), format!("{m:?}: {e}"));
            }
        }
        if self.default_cache_duration.is_none() {
            return bad(
                "defaultCacheDuration",
                "defaultCacheDuration is required".into(),
            );
        }
        if !PLUGIN_VERSIONS.contains(&self.api_version.as_str()) {
            let v = &self.api_version;
            return bad(
                "apiVersion",
                format!("{v:?}: supported values are {PLUGIN_VERSIONS:?}"),
            );
        }
        if let Some(t) = &self.token_attributes {
            t.validate(&self.api_version)
                .map_err(|(f, m)| (format!("tokenAttributes.{f}"), m))?;
        }
        Ok(())
    }

    pub fn cache_duration(&self) -> Duration {
        self.default_cache_duration.map(|d| d.0).unwrap_or_default()
    }
}

impl TokenAttributes {
    fn validate(&self, api_version: &str) -> Result<(), (String, String)> {
        let bad = |f: &str, m: &str| Err((f.to_string(), m.to_string()));
        if api_version != PLUGIN_VERSIONS[0] {
            return bad(
                "",
                "tokenAttributes is only supported for credentialprovider.kubelet.k8s.io/v1",
            );
        }
        if self.service_account_token_audience.trim().is_empty() {
            return bad("serviceAccountTokenAudience", "required");
        }
        if self.require_service_account.is_none() {
            return bad("requireServiceAccount", "required");
        }
        if !["ServiceAccount", "Token"].contains(&self.cache_type.as_str()) {
            return bad("cacheType", "must be ServiceAccount or Token");
        }
        let required = &self.required_service_account_annotation_keys;
        if self
            .optional_service_account_annotation_keys
            .iter()
            .any(|k| required.contains(k))
        {
            return bad(
                "optionalServiceAccountAnnotationKeys",
                "must not repeat a required key",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<ProviderConfig, ProviderConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("providers.yaml");
        std::fs::write(&p, text).unwrap();
        ProviderConfig::load(&p)
    }

    const GOOD: &str = r#"
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
- name: test-provider
  matchImages: ["*.registry.test", "127.0.0.1:5000/team"]
  defaultCacheDuration: 10m
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  args: [get-credentials]
  env: [{name: REGION, value: edge}]
"#;

    #[test]
    fn upstreams_file_reads() {
        let c = load(GOOD).unwrap();
        let p = &c.providers[0];
        assert_eq!(p.name, "test-provider");
        assert_eq!(p.cache_duration(), Duration::from_secs(600));
        assert_eq!(p.env[0].value, "edge");
    }

    #[test]
    fn each_error_names_the_file_and_field() {
        for (edit, field) in [
            (GOOD.replace("kubelet.config.k8s.io/v1\n", "v9\n"), "apiVersion"),
            (GOOD.replace("name: test-provider", "name: ../x"), "providers[0].name"),
            (GOOD.replace("  defaultCacheDuration: 10m\n", ""), "providers[0].defaultCacheDuration"),
            (GOOD.replace("defaultCacheDuration: 10m", "defaultCacheDuration: soon"), "providers[0].defaultCacheDuration"),
            (GOOD.replace("\"*.registry.test\", ", "\"a b\", "), "providers[0].matchImages[0]"),
            (GOOD.replace("credentialprovider.kubelet.k8s.io/v1\n", "x/v1\n"), "providers[0].apiVersion"),
            (GOOD.replace("  args:", "  argz:"), "providers[0]"),
            (
                GOOD.replace("  args:", "  tokenAttributes: {serviceAccountTokenAudience: a, cacheType: Token}\n  args:"),
                "providers[0].tokenAttributes.requireServiceAccount",
            ),
            (format!("{GOOD}- name: test-provider\n  matchImages: [x]\n  defaultCacheDuration: 0s\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n"), "providers[1].name"),
        ] {
            let e = load(&edit).unwrap_err().to_string();
            assert!(e.contains("providers.yaml") && e.contains(field), "{field}: {e}");
        }
    }
}
