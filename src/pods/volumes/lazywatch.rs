//! One watch over a kind of cluster object that the node's pods read
//! only now and then (ClusterTrustBundles, the node's
//! PodCertificateRequests), as upstream's lazily started informers: it
//! starts with the first user and stops with the last, keeps what volumes
//! need of each object by key, and wakes the workers of the pods using it
//! at each change.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};

/// What the watch knows, by key.
pub type Items<V> = Arc<BTreeMap<String, V>>;

#[derive(Clone, Debug)]
enum Known<V> {
    /// The first list has not answered yet.
    Pending,
    Synced(Items<V>),
    /// The first list failed (retried with back-off).
    Failed(String),
}

/// Why the watch cannot answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    #[error("informer has not yet synced")]
    NotSynced,
    #[error("{0}")]
    Failed(String),
}

struct Inner<V> {
    users: usize,
    state: Option<watch::Receiver<Known<V>>>,
    task: Option<tokio::task::AbortHandle>,
}

type Convert<K, V> = fn(K) -> (String, V);

/// What a kube watcher can follow.
pub trait Watched:
    kube::Resource<DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// A watch of `K` objects started on demand, keeping `V` of each.
pub struct LazyWatch<K: kube::Resource, V> {
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
    convert: Convert<K, V>,
    inner: Mutex<Inner<V>>,
    wakers: Arc<Mutex<Vec<Arc<Notify>>>>,
}

impl<K: kube::Resource, V> std::fmt::Debug for LazyWatch<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LazyWatch")
    }
}

impl<K, V> LazyWatch<K, V>
where
    K: Watched,
    V: Clone + PartialEq + Send + Sync + 'static,
{
    pub fn new(
        api: kube::Api<K>,
        config: kube::runtime::watcher::Config,
        convert: Convert<K, V>,
    ) -> Arc<Self> {
        Arc::new(LazyWatch {
            api,
            config,
            convert,
            inner: Mutex::new(Inner {
                users: 0,
                state: None,
                task: None,
            }),
            wakers: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// Follows the objects (the watch starts with the first user); `wake`
    /// is notified whenever one changes.
    pub fn subscribe(self: &Arc<Self>, wake: Arc<Notify>) -> Subscription<K, V> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let rx = match &inner.state {
            Some(rx) => rx.clone(),
            None => {
                let (tx, rx) = watch::channel(Known::Pending);
                let task = tokio::spawn(follow(
                    self.api.clone(),
                    self.config.clone(),
                    self.convert,
                    tx,
                    self.wakers.clone(),
                ));
                inner.task = Some(task.abort_handle());
                inner.state = Some(rx.clone());
                rx
            }
        };
        inner.users += 1;
        self.wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(wake.clone());
        Subscription {
            owner: self.clone(),
            wake,
            rx,
        }
    }
}

/// One pod's hold on the watch; dropping it lets the watch go with the
/// last user.
pub struct Subscription<K: kube::Resource, V> {
    owner: Arc<LazyWatch<K, V>>,
    wake: Arc<Notify>,
    rx: watch::Receiver<Known<V>>,
}

impl<K: kube::Resource, V: Clone> Subscription<K, V> {
    /// The objects as last seen, waiting up to `timeout` for the first
    /// list.
    pub async fn synced(&self, timeout: Duration) -> Result<Items<V>, WatchError> {
        let mut rx = self.rx.clone();
        let wait = rx.wait_for(|k| !matches!(k, Known::Pending));
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(k)) => match &*k {
                Known::Synced(b) => Ok(b.clone()),
                Known::Failed(e) => Err(WatchError::Failed(e.clone())),
                Known::Pending => Err(WatchError::NotSynced),
            },
            _ => Err(WatchError::NotSynced),
        }
    }
}

impl<K: kube::Resource, V> Drop for Subscription<K, V> {
    fn drop(&mut self) {
        self.owner
            .wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|w| !Arc::ptr_eq(w, &self.wake));
        let mut inner = self.owner.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.users = inner.users.saturating_sub(1);
        if inner.users == 0 {
            if let Some(t) = inner.task.take() {
                t.abort();
            }
            inner.state = None;
        }
    }
}

async fn follow<K, V>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
    convert: Convert<K, V>,
    tx: watch::Sender<Known<V>>,
    wakers: Arc<Mutex<Vec<Arc<Notify>>>>,
) where
    K: Watched,
    V: Clone + PartialEq + Send + Sync + 'static,
{
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut listing = BTreeMap::new();
    let mut have: BTreeMap<String, V> = BTreeMap::new();
    while let Some(ev) = stream.next().await {
        // A relist's items are published together once it is done.
        match ev {
            Ok(watcher::Event::Init) => {
                listing.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(o)) => {
                let (k, v) = convert(o);
                listing.insert(k, v);
                continue;
            }
            Ok(watcher::Event::InitDone) => have = std::mem::take(&mut listing),
            Ok(watcher::Event::Apply(o)) => {
                let (k, v) = convert(o);
                if have.get(&k) == Some(&v) {
                    continue;
                }
                have.insert(k, v);
            }
            Ok(watcher::Event::Delete(o)) => {
                have.remove(&convert(o).0);
            }
            // Retried with back-off; a first list that failed is an error
            // to report, a later failure keeps what was seen.
            Err(e) => {
                if matches!(*tx.borrow(), Known::Pending) {
                    tx.send_replace(Known::Failed(e.to_string()));
                }
                continue;
            }
        }
        tx.send_replace(Known::Synced(Arc::new(have.clone())));
        for w in wakers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            w.notify_one();
        }
    }
}
