//! Who is asking and whether they may (upstream's `server/auth.go`):
//! x509 client certificates verified against `clientCAFile` (the TLS layer
//! checks the chain; the subject's CN is the user, its O entries the
//! groups), bearer tokens through TokenReview (cached for `cacheTTL`),
//! `system:anonymous` only when anonymous auth is on; then one
//! SubjectAccessReview per (user, verb, subresource), allowed answers
//! cached 5 min and denials 30 s, with upstream's fine-grained
//! subresources tried before `proxy`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

/// An authenticated caller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    pub uid: String,
}

pub use crate::certificate::der::user_of_cert;

/// The SubjectAccessReview attributes of a request: verb from the method,
/// subresources by path, in the order upstream tries them (fine-grained
/// first, then `proxy`, since 1.36).
pub fn attributes(method: &str, path: &str) -> (&'static str, Vec<&'static str>) {
    let verb = match method {
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "get",
    };
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    let subresources = match first {
        "stats" => vec!["stats"],
        "metrics" => vec!["metrics"],
        "logs" => vec!["log"],
        "checkpoint" => vec!["checkpoint"],
        "statusz" => vec!["statusz"],
        // Upstream authorizes its flags as configuration.
        "flagz" => vec!["configz"],
        "pods" | "runningpods" => vec!["pods", "proxy"],
        "healthz" => vec!["healthz", "proxy"],
        "configz" => vec!["configz", "proxy"],
        _ => vec!["proxy"],
    };
    (verb, subresources)
}

/// Decisions by (user, verb, subresource): allowed or not, and when.
type Decisions = HashMap<(String, &'static str, &'static str), (bool, Instant)>;

const ALLOWED_TTL: Duration = Duration::from_secs(300);
const DENIED_TTL: Duration = Duration::from_secs(30);

/// Authentication and authorization, as configured.
pub struct Auth {
    pub client: Option<kube::Client>,
    pub node: String,
    pub anonymous: bool,
    pub webhook_authn: bool,
    pub token_ttl: Duration,
    pub always_allow: bool,
    tokens: Mutex<HashMap<String, (Option<User>, Instant)>>,
    decisions: Mutex<Decisions>,
}

impl Auth {
    pub fn new(
        client: Option<kube::Client>,
        node: String,
        anonymous: bool,
        webhook_authn: bool,
        token_ttl: Duration,
        always_allow: bool,
    ) -> Self {
        Auth {
            client,
            node,
            anonymous,
            webhook_authn,
            token_ttl,
            always_allow,
            tokens: Mutex::new(HashMap::new()),
            decisions: Mutex::new(HashMap::new()),
        }
    }

    /// The caller of a request: its certificate's subject, its bearer
    /// token's user, or anonymous (when allowed); `None` is a 401.
    pub async fn authenticate(&self, cert: Option<&User>, bearer: Option<&str>) -> Option<User> {
        if let Some(u) = cert {
            return Some(u.clone());
        }
        if let Some(t) = bearer.filter(|_| self.webhook_authn) {
            return self.token_user(t).await;
        }
        self.anonymous.then(|| User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            uid: String::new(),
        })
    }

    async fn token_user(&self, token: &str) -> Option<User> {
        let now = Instant::now();
        if let Some((u, at)) = self.lock_tokens().get(token)
            && now.duration_since(*at) < self.token_ttl
        {
            return u.clone();
        }
        let client = self.client.clone()?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                ..Default::default()
            },
            ..Default::default()
        };
        let r = Api::<TokenReview>::all(client)
            .create(&PostParams::default(), &review)
            .await
            .ok()?;
        let st = r.status.unwrap_or_default();
        let user = st.authenticated.unwrap_or(false).then(|| {
            let ui = st.user.unwrap_or_default();
            User {
                name: ui.username.unwrap_or_default(),
                groups: ui.groups.unwrap_or_default(),
                uid: ui.uid.unwrap_or_default(),
            }
        });
        self.lock_tokens()
            .insert(token.to_string(), (user.clone(), now));
        user
    }

    fn lock_tokens(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Option<User>, Instant)>> {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `user` may `verb` the node's `subresource`; `Err` names
    /// what was asked, for the 403.
    pub async fn authorize(&self, user: &User, method: &str, path: &str) -> Result<(), String> {
        let (verb, subs) = attributes(method, path);
        if self.always_allow {
            return Ok(());
        }
        for sub in &subs {
            if self.allowed(user, verb, sub).await {
                return Ok(());
            }
        }
        Err(format!(
            "Forbidden (user={}, verb={verb}, resource=nodes, subresource(s)=[{}])",
            user.name,
            subs.join(" ")
        ))
    }

    async fn allowed(&self, user: &User, verb: &'static str, sub: &'static str) -> bool {
        let key = (user.name.clone(), verb, sub);
        let now = Instant::now();
        if let Some((ok, at)) = self.lock_decisions().get(&key) {
            let ttl = if *ok { ALLOWED_TTL } else { DENIED_TTL };
            if now.duration_since(*at) < ttl {
                return *ok;
            }
        }
        let Some(client) = self.client.clone() else {
            return false;
        };
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                groups: Some(user.groups.clone()),
                uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    resource: Some("nodes".into()),
                    subresource: Some(sub.into()),
                    name: Some(self.node.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let ok = match Api::<SubjectAccessReview>::all(client)
            .create(&PostParams::default(), &sar)
            .await
        {
            Ok(r) => r.status.is_some_and(|s| s.allowed),
            // Not cached: the next request asks again.
            Err(_) => return false,
        };
        self.lock_decisions().insert(key, (ok, now));
        ok
    }

    fn lock_decisions(&self) -> std::sync::MutexGuard<'_, Decisions> {
        self.decisions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_upstreams_subresources() {
        assert_eq!(attributes("GET", "/stats/summary"), ("get", vec!["stats"]));
        assert_eq!(
            attributes("GET", "/metrics/resource"),
            ("get", vec!["metrics"])
        );
        assert_eq!(attributes("GET", "/pods"), ("get", vec!["pods", "proxy"]));
        assert_eq!(
            attributes("GET", "/healthz"),
            ("get", vec!["healthz", "proxy"])
        );
        assert_eq!(
            attributes("GET", "/containerLogs/ns/p/c"),
            ("get", vec!["proxy"])
        );
        assert_eq!(
            attributes("POST", "/exec/ns/p/c"),
            ("create", vec!["proxy"])
        );
        assert_eq!(attributes("GET", "/logs/messages"), ("get", vec!["log"]));
        // As upstream 1.37's auth.go: statusz its own, flagz as configz,
        // /spec no longer a subresource of its own.
        assert_eq!(attributes("GET", "/statusz"), ("get", vec!["statusz"]));
        assert_eq!(attributes("GET", "/flagz"), ("get", vec!["configz"]));
        assert_eq!(attributes("GET", "/spec/"), ("get", vec!["proxy"]));
    }

    #[test]
    fn a_certificate_subject_becomes_the_user() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let u = user_of_cert(cert.der()).unwrap();
        assert_eq!(u.name, "kube-apiserver-kubelet-client");
        assert_eq!(u.groups, ["system:masters"]);
        assert_eq!(
            user_of_cert(&[0x30, 0x03, 0x01]),
            None,
            "garbage is no user"
        );
    }
}
