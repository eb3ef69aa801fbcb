//! A pod's `clusterTrustBundle` and `podCertificate` sources: the glue
//! between its [`Volumes`] and the node's watches ([`super::trust`],
//! [`super::podcert`]), with the local store's copies for offline starts.

use k8s_openapi::api::core::v1::{ClusterTrustBundleProjection, Pod, PodCertificateProjection};

use super::podcert::{self, CertState, Credential, Next, Pending};
use super::trust::{self, TrustError};
use super::{OBJECT_WAIT, SetUpError, Volumes};

impl Volumes {
    /// A `clusterTrustBundle` source's anchors: from the node's watch, or
    /// the kept copy while the API server does not answer.
    pub(super) async fn trust_anchors(
        &mut self,
        pod: &Pod,
        p: &ClusterTrustBundleProjection,
    ) -> Result<Vec<u8>, SetUpError> {
        let kept_as = match (&p.name, &p.signer_name) {
            (Some(n), _) => format!("ctb/name/{n}"),
            (None, Some(s)) => {
                let sel = serde_json::to_string(&p.label_selector).unwrap_or_default();
                format!("ctb/signer/{s}/{sel}")
            }
            (None, None) => return Err(TrustError::NoSource.into()),
        };
        let Some(src) = self.sources.clone() else {
            return Err(TrustError::Watch(super::lazywatch::WatchError::NotSynced).into());
        };
        let sub = self
            .trust
            .get_or_insert_with(|| src.trust.subscribe(self.wake.clone()));
        let short = src.kept_wait();
        let bundles = match sub.synced(short).await {
            Ok(b) => b,
            Err(e) => match self.kept::<String>(pod, &kept_as).await {
                Some(pem) => return Ok(pem.into_bytes()),
                None => match self.trust.as_ref() {
                    Some(sub) => sub
                        .synced(OBJECT_WAIT.saturating_sub(short))
                        .await
                        .map_err(TrustError::from)?,
                    None => return Err(TrustError::Watch(e).into()),
                },
            },
        };
        let optional = p.optional == Some(true);
        let pem = match (&p.name, &p.signer_name) {
            (Some(n), _) => trust::by_name(&bundles, n, optional)?,
            (_, Some(s)) => trust::by_signer(&bundles, s, p.label_selector.as_ref(), optional)?,
            (None, None) => return Err(TrustError::NoSource.into()),
        };
        let text = String::from_utf8_lossy(&pem).into_owned();
        self.keep(pod, &kept_as, serde_json::to_vec(&text).ok())
            .await;
        Ok(pem)
    }

    /// A `podCertificate` source's credential: stepped on from what the
    /// node's request watch shows, a request made when one is needed.
    pub(super) async fn pod_certificate(
        &mut self,
        pod: &Pod,
        key: (String, usize),
        p: &PodCertificateProjection,
    ) -> Result<Credential, SetUpError> {
        let Some(src) = self.sources.clone() else {
            return Err(podcert::CertError::NotIssued.into());
        };
        let kept_as = format!("podcert/{}/{}", key.0, key.1);
        let now = jiff::Timestamp::now().as_second();
        let mut state = self.certs.remove(&key).unwrap_or_default();
        if state == CertState::Initial
            && let Some(c) = self.kept::<Credential>(pod, &kept_as).await
            && c.not_after > now
        {
            state = CertState::Fresh(c);
        }
        let sub = self
            .requests
            .get_or_insert_with(|| src.requests.subscribe(self.wake.clone()));
        let requests = sub.synced(src.kept_wait()).await.unwrap_or_default();
        let (mut state, next) = podcert::step(state, &requests, now);
        if next == Next::Request {
            match self.request_certificate(pod, &src, p).await {
                Ok(pending) => {
                    state = match state {
                        CertState::Fresh(c) => CertState::WaitRefresh(c, pending),
                        _ => CertState::Wait(pending),
                    }
                }
                // Served on while a refresh cannot be asked for.
                Err(e) if !matches!(state, CertState::Fresh(_)) => {
                    self.certs.insert(key, state);
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot refresh a pod certificate");
                    // Asked again in a while, not at every round.
                    if let CertState::Fresh(c) = &mut state {
                        c.begin_refresh_at = now + super::OFFLINE_RETRY.as_secs() as i64;
                    }
                }
            }
        }
        let out = match &state {
            CertState::Fresh(c) | CertState::WaitRefresh(c, _) => Ok(c.clone()),
            CertState::Refused(e) => Err(e.clone().into()),
            _ => Err(podcert::CertError::NotIssued.into()),
        };
        if let CertState::Fresh(c) = &state {
            self.keep(pod, &kept_as, serde_json::to_vec(c).ok()).await;
        }
        self.certs.insert(key, state);
        out
    }

    /// A new key and a request for it to the source's signer.
    async fn request_certificate(
        &self,
        pod: &Pod,
        src: &super::Sources,
        p: &PodCertificateProjection,
    ) -> Result<Pending, SetUpError> {
        use k8s_openapi::api::certificates::v1::PodCertificateRequest;
        use k8s_openapi::api::core::v1::{Node, ServiceAccount};
        let failed = |e: kube::Error| podcert::CertError::Create(e.to_string());
        let (ns, name) = crate::pods::util::namespace_and_name(pod);
        let sa = crate::pods::util::service_account(pod);
        let sa_api = kube::Api::<ServiceAccount>::namespaced(src.client.clone(), &ns);
        let sa_uid = sa_api.get(&sa).await.map_err(failed)?.metadata.uid;
        let node_uid = src
            .node_uid
            .get_or_try_init(|| async {
                let nodes = kube::Api::<Node>::all(src.client.clone());
                let n = nodes.get(&self.node.node_name).await?;
                Ok::<_, kube::Error>(n.metadata.uid.unwrap_or_default())
            })
            .await
            .map_err(failed)?;
        let (key, csr) = podcert::new_key(&p.key_type)?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let who = podcert::Asker {
            namespace: &ns,
            pod: &name,
            pod_uid: &uid,
            service_account: &sa,
            service_account_uid: sa_uid.unwrap_or_default(),
            node: &self.node.node_name,
            node_uid: node_uid.clone(),
        };
        let req = podcert::request_for(&who, p, csr);
        let api = kube::Api::<PodCertificateRequest>::namespaced(src.client.clone(), &ns);
        let made = api
            .create(&Default::default(), &req)
            .await
            .map_err(failed)?;
        let created = made
            .metadata
            .creation_timestamp
            .map_or(jiff::Timestamp::now().as_second(), |t| t.0.as_second());
        Ok(Pending {
            key,
            request: format!("{ns}/{}", made.metadata.name.unwrap_or_default()),
            abandon_at: created + podcert::ABANDON_AFTER,
        })
    }
}
