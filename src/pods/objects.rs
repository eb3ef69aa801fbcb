//! ConfigMaps and Secrets a pod's containers read (env `valueFrom`,
//! `envFrom`, image pull secrets), fetched from the API server as the
//! Node authorizer allows for objects the node's pods refer to. Read at
//! each container start (no cache: a changed object reaches the next
//! restart).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::Client;
use kube::api::Api;

use super::util::{self, ConfigError, ObjectError, ObjectKind, ObjectSource};

/// Fetches the ConfigMaps and Secrets `c`'s environment reads. Without an
/// API server nothing can be found: optional references are skipped by
/// the caller, the others fail as not found.
pub async fn env_objects(
    source: Option<&dyn ObjectSource>,
    pod: &Pod,
    c: &Container,
) -> Result<EnvObjects, ObjectError> {
    let mut out = EnvObjects::default();
    let refs = EnvObjects::refs(c);
    if refs.is_empty() {
        return Ok(out);
    }
    let (ns, _) = util::namespace_and_name(pod);
    for (kind, name) in refs {
        let got = match source {
            Some(src) => src.get(kind, &ns, &name).await?,
            None => None,
        };
        out.0.insert((kind, name), got);
    }
    Ok(out)
}

/// One object an environment read: kind, name, data (`None`: missing).
type KeptObject = (ObjectKind, String, Option<BTreeMap<String, String>>);

/// A container's environment objects and service variables as last read.
#[derive(serde::Serialize, serde::Deserialize)]
struct KeptEnv {
    objects: Vec<KeptObject>,
    services: Vec<(String, String)>,
}

/// The environment a container's last start read, as the local store
/// keeps it (see [`kept_env`]).
pub async fn read_kept_env(
    store: Option<&std::sync::Arc<crate::store::LocalStore>>,
    pod_uid: &str,
    container: &str,
) -> Option<EnvObjects> {
    let name = format!("env/{container}");
    let k = store?.read_json::<KeptEnv>(pod_uid, &name).await?;
    Some(EnvObjects(
        k.objects.into_iter().map(|(k, n, v)| ((k, n), v)).collect(),
        k.services,
    ))
}

/// What a container's environment read (`read`), kept in the local store
/// for its next start; when it could not be read (the API server cannot be
/// reached, the Services not listed yet) the last kept copy (`kept`, from
/// [`read_kept_env`]) stands in, so a container starts again after an
/// offline reboot. A deliberate difference: upstream refuses to start it
/// until the Services are read.
pub async fn kept_env(
    store: Option<std::sync::Arc<crate::store::LocalStore>>,
    pod_uid: &str,
    container: &str,
    read: Result<EnvObjects, ObjectError>,
    kept: Option<EnvObjects>,
) -> Result<EnvObjects, ObjectError> {
    let Some(store) = store else {
        return read;
    };
    let name = format!("env/{container}");
    match read {
        Ok(env) => {
            let kept = KeptEnv {
                objects: env
                    .0
                    .iter()
                    .map(|((k, n), v)| (*k, n.clone(), v.clone()))
                    .collect(),
                services: env.1.clone(),
            };
            if let Ok(bytes) = serde_json::to_vec(&kept) {
                let _ = store.write(pod_uid, &name, Some(bytes)).await;
            }
            Ok(env)
        }
        Err(e) => kept.ok_or(e),
    }
}

/// The object source of a node connected to an API server.
#[derive(Clone)]
pub struct ApiObjects(pub Client);

impl std::fmt::Debug for ApiObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiObjects")
    }
}

impl ObjectSource for ApiObjects {
    fn get<'a>(
        &'a self,
        kind: ObjectKind,
        namespace: &'a str,
        name: &'a str,
    ) -> kinglet_runtime::BoxFuture<'a, Result<Option<BTreeMap<String, String>>, ObjectError>> {
        use k8s_openapi::api::core::v1::{ConfigMap, Secret};
        Box::pin(async move {
            // Upstream's message for an object it could not read.
            let failed = |e: kube::Error| ObjectError::Get {
                kind,
                namespace: namespace.into(),
                name: name.into(),
                cause: e.to_string(),
            };
            match kind {
                ObjectKind::ConfigMap => Api::<ConfigMap>::namespaced(self.0.clone(), namespace)
                    .get_opt(name)
                    .await
                    .map(|o| o.map(|cm| cm.data.unwrap_or_default()))
                    .map_err(failed),
                ObjectKind::Secret => Api::<Secret>::namespaced(self.0.clone(), namespace)
                    .get_opt(name)
                    .await
                    .map(|o| {
                        o.map(|s| {
                            let mut data: BTreeMap<String, String> = s
                                .data
                                .unwrap_or_default()
                                .into_iter()
                                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                                .collect();
                            data.extend(s.string_data.unwrap_or_default());
                            data
                        })
                    })
                    .map_err(failed),
            }
        })
    }
}

/// A ConfigMap's or Secret's contents as volumes need them: bytes by key
/// (a ConfigMap's `data` and `binaryData`, a Secret's `data`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Object {
    pub data: BTreeMap<String, Vec<u8>>,
    pub immutable: bool,
}

impl Object {
    fn of_config_map(cm: k8s_openapi::api::core::v1::ConfigMap) -> Self {
        let mut data: BTreeMap<String, Vec<u8>> = cm
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        data.extend(
            cm.binary_data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0)),
        );
        Object {
            data,
            immutable: cm.immutable == Some(true),
        }
    }

    fn of_secret(s: k8s_openapi::api::core::v1::Secret) -> Self {
        let mut data: BTreeMap<String, Vec<u8>> = s
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        data.extend(
            s.string_data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes())),
        );
        Object {
            data,
            immutable: s.immutable == Some(true),
        }
    }
}

type Key = (ObjectKind, String, String);

/// What a watch knows of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Known {
    /// The first list has not answered yet.
    Pending,
    Found(Option<Object>),
    Failed(ObjectError),
}

struct Slot {
    state: std::sync::Mutex<Known>,
    /// Woken at each change (first-sync waiters).
    changed: tokio::sync::Notify,
    /// The workers of the pods using it, woken at each change.
    wakers: std::sync::Mutex<Vec<std::sync::Arc<tokio::sync::Notify>>>,
}

impl Slot {
    fn state(&self) -> Known {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, k: Known) {
        {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if *s == k {
                return;
            }
            *s = k;
        }
        self.changed.notify_waiters();
        for w in self.wakers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            w.notify_one();
        }
    }
}

struct Entry {
    slot: std::sync::Arc<Slot>,
    users: usize,
    task: tokio::task::AbortHandle,
}

/// The ConfigMaps and Secrets the node's volumes use, each followed by one
/// watch (upstream's watch-based change detection): a change wakes the
/// workers of the pods that use it at once, and many pods using one object
/// cost one watch. A watch ends when its last user goes, or once the
/// object is immutable. The Node authorizer allows a node to watch, by
/// name, the objects its pods refer to.
pub struct ObjectCache {
    client: Client,
    entries: std::sync::Mutex<std::collections::HashMap<Key, Entry>>,
}

impl std::fmt::Debug for ObjectCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ObjectCache")
    }
}

/// One user's hold on a watched object; dropping it lets the watch go.
pub struct Subscription {
    cache: std::sync::Arc<ObjectCache>,
    key: Key,
    slot: std::sync::Arc<Slot>,
    wake: std::sync::Arc<tokio::sync::Notify>,
}

impl ObjectCache {
    pub fn new(client: Client) -> std::sync::Arc<Self> {
        std::sync::Arc::new(ObjectCache {
            client,
            entries: std::sync::Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// Follows the object (one watch per object, shared); `wake` is
    /// notified whenever it changes.
    pub fn subscribe(
        self: &std::sync::Arc<Self>,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
        wake: std::sync::Arc<tokio::sync::Notify>,
    ) -> Subscription {
        let key = (kind, namespace.to_string(), name.to_string());
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let entry = entries.entry(key.clone()).or_insert_with(|| {
            let slot = std::sync::Arc::new(Slot {
                state: std::sync::Mutex::new(Known::Pending),
                changed: tokio::sync::Notify::new(),
                wakers: std::sync::Mutex::new(Vec::new()),
            });
            let task = tokio::spawn(follow(self.client.clone(), key.clone(), slot.clone()));
            Entry {
                slot,
                users: 0,
                task: task.abort_handle(),
            }
        });
        entry.users += 1;
        entry
            .slot
            .wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(wake.clone());
        Subscription {
            cache: self.clone(),
            key,
            slot: entry.slot.clone(),
            wake,
        }
    }
}

impl Subscription {
    /// The object as last seen (`None`: it does not exist), waiting up to
    /// `timeout` for the first answer.
    pub async fn get(&self, timeout: std::time::Duration) -> Result<Option<Object>, ObjectError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.slot.changed.notified();
            match self.slot.state() {
                Known::Found(o) => return Ok(o),
                Known::Failed(e) => return Err(e),
                Known::Pending => {}
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                let (kind, ns, name) = &self.key;
                return Err(ObjectError::SyncTimeout {
                    kind: *kind,
                    namespace: ns.clone(),
                    name: name.clone(),
                });
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.slot
            .wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|w| !std::sync::Arc::ptr_eq(w, &self.wake));
        let mut entries = self.cache.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.get_mut(&self.key) {
            e.users = e.users.saturating_sub(1);
            if e.users == 0 {
                e.task.abort();
                entries.remove(&self.key);
            }
        }
    }
}

async fn follow(client: Client, key: Key, slot: std::sync::Arc<Slot>) {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let (kind, ns, name) = key;
    match kind {
        ObjectKind::ConfigMap => {
            let api = Api::<ConfigMap>::namespaced(client, &ns);
            follow_one(api, &name, slot, Object::of_config_map).await
        }
        ObjectKind::Secret => {
            let api = Api::<Secret>::namespaced(client, &ns);
            follow_one(api, &name, slot, Object::of_secret).await
        }
    }
}

async fn follow_one<K>(api: Api<K>, name: &str, slot: std::sync::Arc<Slot>, conv: fn(K) -> Object)
where
    K: super::volumes::lazywatch::Watched,
{
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, cfg).default_backoff().boxed();
    let mut pending = None;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Init) => pending = None,
            Ok(watcher::Event::InitApply(o)) => pending = Some(conv(o)),
            Ok(watcher::Event::InitDone) => slot.set(Known::Found(pending.take())),
            Ok(watcher::Event::Apply(o)) => slot.set(Known::Found(Some(conv(o)))),
            Ok(watcher::Event::Delete(_)) => slot.set(Known::Found(None)),
            // Retried with back-off; a first answer that never came is an
            // error to report, a later one keeps the last known object.
            Err(e) if slot.state() == Known::Pending => {
                slot.set(Known::Failed(ObjectError::Watch(e.to_string())))
            }
            Err(_) => {}
        }
        // An immutable object never changes: no need to go on watching.
        if matches!(slot.state(), Known::Found(Some(ref o)) if o.immutable) {
            return;
        }
    }
}

/// The objects a container's environment refers to, fetched before its
/// config is built: `None` for an object that does not exist; and the
/// service variables, which come first (the container's own override them).
#[derive(Clone, Debug, Default)]
pub struct EnvObjects(
    pub BTreeMap<(ObjectKind, String), Option<BTreeMap<String, String>>>,
    pub Vec<(String, String)>,
);

impl EnvObjects {
    /// What `c`'s env and envFrom refer to.
    pub fn refs(c: &Container) -> Vec<(ObjectKind, String)> {
        let mut out = Vec::new();
        for e in c.env_from.iter().flatten() {
            if let Some(r) = &e.config_map_ref {
                out.push((ObjectKind::ConfigMap, r.name.clone()));
            }
            if let Some(r) = &e.secret_ref {
                out.push((ObjectKind::Secret, r.name.clone()));
            }
        }
        for e in c.env.iter().flatten() {
            if let Some(vf) = &e.value_from {
                if let Some(r) = &vf.config_map_key_ref {
                    out.push((ObjectKind::ConfigMap, r.name.clone()));
                }
                if let Some(r) = &vf.secret_key_ref {
                    out.push((ObjectKind::Secret, r.name.clone()));
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    pub(crate) fn get(&self, kind: ObjectKind, name: &str) -> Option<&BTreeMap<String, String>> {
        self.0
            .get(&(kind, name.to_string()))
            .and_then(|o| o.as_ref())
    }

    /// One key, as upstream resolves `configMapKeyRef`/`secretKeyRef`.
    pub(crate) fn key(
        &self,
        kind: ObjectKind,
        ns: &str,
        name: &str,
        key: &str,
        optional: bool,
    ) -> Result<Option<String>, ConfigError> {
        match self.get(kind, name) {
            None if optional => Ok(None),
            None => Err(ConfigError(format!("{} {name:?} not found", kind.lower()))),
            Some(data) => match data.get(key) {
                Some(v) => Ok(Some(v.clone())),
                None if optional => Ok(None),
                None => Err(ConfigError(format!(
                    "couldn't find key {key} in {} {ns}/{name}",
                    kind.title()
                ))),
            },
        }
    }
}
