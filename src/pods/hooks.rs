//! Lifecycle hooks (upstream's `pkg/kubelet/lifecycle/handlers.go`):
//! `postStart` and `preStop` handlers `exec`, `httpGet` and `sleep`, with
//! upstream's failure messages. The worker decides when they run and what
//! a failure does (a failed `postStart` kills the container; a failed
//! `preStop` is reported and the stop goes on).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use kinglet_runtime::Runtime;

use super::prober::{self, handlers};
use crate::pods::util::format_pod;

/// How long an HTTP hook may take when nothing else bounds it: the caller
/// cancels it sooner when the pod is killed.
const HTTP_HOOK_LIMIT: Duration = Duration::from_secs(3600);

/// Go's `%v` of a string slice: `[sh -c exit 1]`.
fn go_list(cmd: &[String]) -> String {
    format!("[{}]", cmd.join(" "))
}

/// Why a hook failed; its message is upstream's, for the event.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("Exec lifecycle hook ({}) {who} failed - error: {error}, message: {output:?}", go_list(.cmd))]
    Exec {
        cmd: Vec<String>,
        who: String,
        error: String,
        output: String,
    },
    #[error("HTTP lifecycle hook ({path}) {who} failed - error: {source}")]
    Http {
        path: String,
        who: String,
        source: handlers::ProbeError,
    },
    #[error("Cannot run handler: invalid handler: no exec, httpGet or sleep")]
    NoHandler,
}

/// Runs one handler for container `c` (ID `id`) of `pod`.
pub async fn run(
    rt: &dyn Runtime,
    pod: &Pod,
    c: &Container,
    id: &str,
    h: &LifecycleHandler,
    pod_ip: &str,
) -> Result<(), HookError> {
    let who = format!("for Container {:?} in Pod {:?}", c.name, format_pod(pod));
    if let Some(e) = &h.exec {
        let cmd = e.command.clone().unwrap_or_default();
        let (err, output) = match rt.exec_sync(id, &cmd, Duration::ZERO).await {
            Ok(r) if r.exit_code == 0 => return Ok(()),
            Ok(r) => {
                let mut out = r.stdout;
                out.extend_from_slice(&r.stderr);
                let out = String::from_utf8_lossy(&out).into_owned();
                let err = format!(
                    "command '{}' exited with {}: {}",
                    cmd.join(" "),
                    r.exit_code,
                    String::from_utf8_lossy(&r.stderr)
                );
                (err, out)
            }
            Err(e) => (e.to_string(), String::new()),
        };
        return Err(HookError::Exec {
            cmd,
            who,
            error: err,
            output,
        });
    }
    if let Some(g) = &h.http_get {
        let path = g.path.clone().unwrap_or_default();
        let fail = |source| HookError::Http {
            path: path.clone(),
            who: who.clone(),
            source,
        };
        let target = prober::http_target(g, c, pod_ip).map_err(fail)?;
        // Any answer will do: only a failure to get one fails the hook.
        return handlers::http_status(&target, HTTP_HOOK_LIMIT, handlers::HOOK_USER_AGENT)
            .await
            .map(|_| ())
            .map_err(fail);
    }
    if let Some(s) = &h.sleep {
        tokio::time::sleep(Duration::from_secs(s.seconds.max(0) as u64)).await;
        return Ok(());
    }
    Err(HookError::NoHandler)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinglet_runtime::fake::FakeRuntime;

    fn handler(yaml: &str) -> LifecycleHandler {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[tokio::test]
    async fn exec_hooks_fail_with_upstreams_message() {
        let rt = FakeRuntime::new();
        rt.set_exec_exit("c1", 1);
        let mut pod = crate::pods::test_pod("u1");
        pod.metadata.name = Some("web".into());
        pod.metadata.namespace = Some("ns".into());
        let c = Container {
            name: "app".into(),
            ..Default::default()
        };
        let h = handler("exec: {command: [sh, -c, 'exit 1']}");
        let err = run(&rt, &pod, &c, "c1", &h, "")
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "Exec lifecycle hook ([sh -c exit 1]) for Container \"app\" in Pod \"web_ns(u1)\" failed - error: command 'sh -c exit 1' exited with 1: , message: \"exit 1\\n\""
        );
        rt.set_exec_exit("c1", 0);
        assert!(run(&rt, &pod, &c, "c1", &h, "").await.is_ok());
    }

    #[tokio::test]
    async fn an_http_hook_to_nowhere_fails_and_any_answer_succeeds() {
        let rt = FakeRuntime::new();
        let pod = crate::pods::test_pod("u1");
        let c = Container::default();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let h = handler(&format!("httpGet: {{path: /hook, port: {port}}}"));
        let err = run(&rt, &pod, &c, "c1", &h, "127.0.0.1")
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("HTTP lifecycle hook (/hook) for Container"),
            "{err}"
        );
        assert!(err.contains("connection refused"), "{err}");
    }
}
