//! Who is asking and whether they may (upstream's `server/auth.go`):
//! x509 client certificates verified against `clientCAFile` (the TLS layer
//! checks the chain; the subject's CN is the user, its O entries the
//! groups), bearer tokens through TokenReview (cached for `cacheTTL`,
//! failures 30 s), `system:anonymous` only when anonymous auth is on; then
//! one SubjectAccessReview per (user, verb, subresource), allowed answers
//! cached 5 min and denials 30 s, with upstream's fine-grained
//! subresources tried before `proxy`.
//!
//! What an unauthenticated peer can grow is bounded: both caches hold a
//! fixed number of entries ([`Expiring`]), tokens are kept as their
//! SHA-256 (as upstream's token cache keys by a hash), a token over
//! [`MAX_TOKEN_BYTES`] is refused without a review, and each client
//! address may cause [`REVIEWS_PER_SECOND`] TokenReviews a second (a
//! burst of [`REVIEW_BURST`]); past that it gets 429.
//!
//! Requests that need the same SubjectAccessReview while it is being asked
//! share it: a burst of 20 `kubectl exec`s costs the API server one review
//! (and kinglet one connection to it), not 20.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
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

/// The user of a client certificate: its CN the name, its Os the groups
/// (as upstream's x509 authenticator).
pub fn user_of_cert(der: &[u8]) -> Option<User> {
    let s = crate::certificate::der::subject_of_cert(der)?;
    Some(User {
        name: s.common_name,
        groups: s.organizations,
        uid: String::new(),
    })
}

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

/// Decisions by (user, verb, subresource): allowed or not.
type Decisions = Expiring<(String, &'static str, &'static str), bool>;

const ALLOWED_TTL: Duration = Duration::from_secs(300);
const DENIED_TTL: Duration = Duration::from_secs(30);
/// How long a token the API server refused stays refused here.
const UNAUTHENTICATED_TTL: Duration = Duration::from_secs(30);
/// Upstream's webhook authorizer cache size.
const DECISIONS_MAX: usize = 8192;
/// Tokens cached at most (32 bytes of hash and the user each).
const TOKENS_MAX: usize = 4096;
/// The longest bearer token reviewed (service account tokens are about
/// 1 KiB, OIDC ones a few).
pub const MAX_TOKEN_BYTES: usize = 16 << 10;
/// TokenReviews one client address may cause, a second and at once.
pub const REVIEWS_PER_SECOND: f64 = 10.0;
pub const REVIEW_BURST: f64 = 20.0;
/// Client addresses whose review budget is tracked.
const CLIENTS_MAX: usize = 1024;

/// A map of at most `cap` entries that expire: when full, the oldest
/// insertion goes first (entries live minutes at most, so this is close
/// to upstream's LRU and needs no reordering on a hit).
pub struct Expiring<K, V> {
    map: HashMap<K, (V, Instant, u64)>,
    order: VecDeque<(K, u64)>,
    cap: usize,
    next: u64,
}

impl<K: Hash + Eq + Clone, V> Expiring<K, V> {
    pub fn new(cap: usize) -> Self {
        Expiring {
            map: HashMap::new(),
            order: VecDeque::new(),
            cap: cap.max(1),
            next: 0,
        }
    }

    /// The value of `k` unless it expired by `now`.
    pub fn get(&self, k: &K, now: Instant) -> Option<&V> {
        self.map
            .get(k)
            .filter(|(_, until, _)| now < *until)
            .map(|(v, _, _)| v)
    }

    pub fn get_mut(&mut self, k: &K, now: Instant) -> Option<&mut V> {
        self.map
            .get_mut(k)
            .filter(|(_, until, _)| now < *until)
            .map(|(v, _, _)| v)
    }

    /// Keeps `v` for `k` until `until`, dropping the oldest entries past
    /// the bound.
    pub fn insert(&mut self, k: K, v: V, until: Instant) {
        self.next += 1;
        self.map.insert(k.clone(), (v, until, self.next));
        self.order.push_back((k, self.next));
        while self.map.len() > self.cap || self.order.len() > 2 * self.cap {
            let Some((old, stamp)) = self.order.pop_front() else {
                break;
            };
            // A key inserted again since is younger than this record.
            if self.map.get(&old).is_some_and(|(_, _, s)| *s == stamp) {
                self.map.remove(&old);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// A client address's TokenReview budget (a token bucket).
struct Budget {
    tokens: f64,
    at: Instant,
}

/// The (user, verb, subresource) a SubjectAccessReview answers.
type DecisionKey = (String, &'static str, &'static str);

/// A review being asked, which later requests for the same key await.
type Flight = Shared<BoxFuture<'static, bool>>;

/// Why a request gets no user.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// 401.
    Unauthorized,
    /// 429: the address caused too many TokenReviews.
    TooManyReviews,
}

/// A request the node's authorizer refused (a 403), in upstream's words.
#[derive(Debug, thiserror::Error)]
#[error("Forbidden (user={user}, verb={verb}, resource=nodes, subresource(s)=[{subresources}])")]
pub struct Forbidden {
    pub user: String,
    pub verb: &'static str,
    pub subresources: String,
}

/// Authentication and authorization, as configured.
pub struct Auth {
    pub client: Option<kube::Client>,
    pub node: String,
    pub anonymous: bool,
    pub webhook_authn: bool,
    pub token_ttl: Duration,
    pub always_allow: bool,
    tokens: Mutex<Expiring<[u8; 32], Option<User>>>,
    budgets: Mutex<Expiring<IpAddr, Budget>>,
    decisions: Arc<Mutex<Decisions>>,
    /// Reviews being asked; an entry goes when its review is answered.
    flights: Arc<Mutex<HashMap<DecisionKey, Flight>>>,
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
            tokens: Mutex::new(Expiring::new(TOKENS_MAX)),
            budgets: Mutex::new(Expiring::new(CLIENTS_MAX)),
            decisions: Arc::new(Mutex::new(Expiring::new(DECISIONS_MAX))),
            flights: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The caller of a request from `peer`: its certificate's subject,
    /// its bearer token's user, or anonymous (when allowed).
    pub async fn authenticate(
        &self,
        cert: Option<&User>,
        bearer: Option<&str>,
        peer: IpAddr,
    ) -> Result<User, Refused> {
        if let Some(u) = cert {
            return Ok(u.clone());
        }
        if let Some(t) = bearer.filter(|_| self.webhook_authn) {
            return self.token_user(t, peer).await;
        }
        let anonymous = User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            uid: String::new(),
        };
        self.anonymous
            .then_some(anonymous)
            .ok_or(Refused::Unauthorized)
    }

    async fn token_user(&self, token: &str, peer: IpAddr) -> Result<User, Refused> {
        if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
            return Err(Refused::Unauthorized);
        }
        let key: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some(u) = lock(&self.tokens).get(&key, now) {
            return u.clone().ok_or(Refused::Unauthorized);
        }
        if !self.spend_review(peer, now) {
            return Err(Refused::TooManyReviews);
        }
        let client = self.client.clone().ok_or(Refused::Unauthorized)?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                ..Default::default()
            },
            ..Default::default()
        };
        // Not cached when the API server does not answer: the next
        // request asks again.
        let r = Api::<TokenReview>::all(client)
            .create(&PostParams::default(), &review)
            .await
            .map_err(|_| Refused::Unauthorized)?;
        let st = r.status.unwrap_or_default();
        let user = st.authenticated.unwrap_or(false).then(|| {
            let ui = st.user.unwrap_or_default();
            User {
                name: ui.username.unwrap_or_default(),
                groups: ui.groups.unwrap_or_default(),
                uid: ui.uid.unwrap_or_default(),
            }
        });
        let ttl = if user.is_some() {
            self.token_ttl
        } else {
            UNAUTHENTICATED_TTL
        };
        lock(&self.tokens).insert(key, user.clone(), now + ttl);
        user.ok_or(Refused::Unauthorized)
    }

    /// Takes one TokenReview from `peer`'s budget, if it has one left.
    fn spend_review(&self, peer: IpAddr, now: Instant) -> bool {
        let mut budgets = lock(&self.budgets);
        let idle = Duration::from_secs_f64(REVIEW_BURST / REVIEWS_PER_SECOND);
        let Some(b) = budgets.get_mut(&peer, now) else {
            let b = Budget {
                tokens: REVIEW_BURST - 1.0,
                at: now,
            };
            budgets.insert(peer, b, now + idle);
            return true;
        };
        let refill = now.duration_since(b.at).as_secs_f64() * REVIEWS_PER_SECOND;
        b.tokens = (b.tokens + refill).min(REVIEW_BURST);
        b.at = now;
        if b.tokens < 1.0 {
            return false;
        }
        b.tokens -= 1.0;
        true
    }

    /// Whether `user` may `verb` the node's `subresource`; `Err` names
    /// what was asked, for the 403.
    pub async fn authorize(&self, user: &User, method: &str, path: &str) -> Result<(), Forbidden> {
        let (verb, subs) = attributes(method, path);
        if self.always_allow {
            return Ok(());
        }
        for sub in &subs {
            if self.allowed(user, verb, sub).await {
                return Ok(());
            }
        }
        Err(Forbidden {
            user: user.name.clone(),
            verb,
            subresources: subs.join(" "),
        })
    }

    async fn allowed(&self, user: &User, verb: &'static str, sub: &'static str) -> bool {
        let key = (user.name.clone(), verb, sub);
        let now = Instant::now();
        if let Some(ok) = lock(&self.decisions).get(&key, now) {
            return *ok;
        }
        let Some(client) = self.client.clone() else {
            return false;
        };
        let flight = {
            let mut flights = lock(&self.flights);
            match flights.get(&key) {
                Some(f) => f.clone(),
                None => {
                    let f = self.review(client, user, key.clone());
                    flights.insert(key, f.clone());
                    f
                }
            }
        };
        flight.await
    }

    /// Asks the API server whether `user` may do `key`'s verb on the
    /// node's subresource, in a task of its own (so the review ends, is
    /// cached and leaves [`Auth::flights`] even when every request
    /// awaiting it is gone).
    fn review(&self, client: kube::Client, user: &User, key: DecisionKey) -> Flight {
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                groups: Some(user.groups.clone()),
                uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(key.1.into()),
                    resource: Some("nodes".into()),
                    subresource: Some(key.2.into()),
                    name: Some(self.node.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let (decisions, flights) = (self.decisions.clone(), self.flights.clone());
        let task = tokio::spawn(async move {
            let answer = Api::<SubjectAccessReview>::all(client)
                .create(&PostParams::default(), &sar)
                .await;
            let ok = answer
                .as_ref()
                .is_ok_and(|r| r.status.as_ref().is_some_and(|s| s.allowed));
            // An error is not cached: the next request asks again.
            if answer.is_ok() {
                let ttl = if ok { ALLOWED_TTL } else { DENIED_TTL };
                lock(&decisions).insert(key.clone(), ok, Instant::now() + ttl);
            }
            lock(&flights).remove(&key);
            ok
        });
        task.map(|r| r.unwrap_or(false)).boxed().shared()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake API server answering SubjectAccessReviews (allowed, after
    /// 50 ms) and counting them.
    fn reviewing_client(seen: Arc<std::sync::atomic::AtomicUsize>) -> kube::Client {
        use kube::client::Body;
        let svc = tower::service_fn(move |req: http::Request<Body>| {
            let seen = seen.clone();
            async move {
                let body = req.into_body().collect_bytes().await?;
                let mut sar: serde_json::Value = serde_json::from_slice(&body).unwrap();
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                sar["status"] = serde_json::json!({"allowed": true});
                let response = http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&sar).unwrap()))
                    .unwrap();
                Ok::<_, kube::Error>(response)
            }
        });
        kube::Client::new(svc, "default")
    }

    /// 20 requests at once that need the same review make one; the answer
    /// is cached; a request whose caller went away still leaves nothing
    /// in flight.
    #[tokio::test(start_paused = true)]
    async fn concurrent_requests_share_one_review() {
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let auth = Arc::new(Auth::new(
            Some(reviewing_client(seen.clone())),
            "n".into(),
            false,
            true,
            Duration::from_secs(120),
            false,
        ));
        let user = User {
            name: "system:kube-apiserver".into(),
            ..Default::default()
        };
        let calls = (0..20).map(|_| {
            let (auth, user) = (auth.clone(), user.clone());
            tokio::spawn(async move { auth.authorize(&user, "POST", "/exec/ns/p/c").await })
        });
        for r in futures::future::join_all(calls).await {
            assert!(r.unwrap().is_ok());
        }
        let reviews = |n| seen.load(std::sync::atomic::Ordering::SeqCst) == n;
        assert!(reviews(1), "{seen:?} reviews");
        assert!(lock(&auth.flights).is_empty());
        auth.authorize(&user, "POST", "/exec/ns/p/c").await.unwrap();
        assert!(reviews(1), "cached, yet {seen:?} reviews");
        // A caller that gives up: its review still ends and is cached.
        let other = User {
            name: "other".into(),
            ..Default::default()
        };
        let gone = tokio::time::timeout(
            Duration::from_millis(10),
            auth.authorize(&other, "POST", "/exec/ns/p/c"),
        )
        .await;
        assert!(gone.is_err());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(lock(&auth.flights).is_empty());
        auth.authorize(&other, "POST", "/exec/ns/p/c")
            .await
            .unwrap();
        assert!(reviews(2), "{seen:?} reviews");
    }

    #[test]
    fn the_caches_stay_bounded_and_expire() {
        let now = Instant::now();
        let mut c = Expiring::new(3);
        for i in 0..10 {
            c.insert(i, i * 10, now + Duration::from_secs(60));
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&9, now), Some(&90));
        assert_eq!(c.get(&0, now), None, "the oldest went first");
        // Inserted again: the older record of it no longer evicts it.
        c.insert(7, 71, now + Duration::from_secs(60));
        c.insert(10, 100, now + Duration::from_secs(60));
        assert_eq!(c.get(&7, now), Some(&71));
        assert_eq!(c.get(&10, now + Duration::from_secs(61)), None, "expired");
        for i in 0..10_000 {
            c.insert(i % 5, i, now + Duration::from_secs(60));
        }
        assert!(c.len() <= 3 && c.order.len() <= 6);
    }

    #[tokio::test]
    async fn tokens_are_bounded_in_size_and_reviews_per_address() {
        // No API client: a review that passes the gates is refused 401.
        let auth = Auth::new(None, "n".into(), false, true, ALLOWED_TTL, false);
        let peer: IpAddr = "192.0.2.7".parse().unwrap();
        let huge = "x".repeat(MAX_TOKEN_BYTES + 1);
        assert_eq!(
            auth.authenticate(None, Some(&huge), peer).await,
            Err(Refused::Unauthorized)
        );
        let mut refused = Vec::new();
        for i in 0..30 {
            refused.push(auth.authenticate(None, Some(&format!("t{i}")), peer).await);
        }
        let limited = refused
            .iter()
            .filter(|r| **r == Err(Refused::TooManyReviews))
            .count();
        assert_eq!(limited, 30 - REVIEW_BURST as usize);
        // Another address has its own budget.
        let other: IpAddr = "192.0.2.8".parse().unwrap();
        assert_eq!(
            auth.authenticate(None, Some("t99"), other).await,
            Err(Refused::Unauthorized)
        );
    }

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
