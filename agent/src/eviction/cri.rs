//! The CRI evictor: stops an evicted pod at the runtime, as kubelet's kill
//! does, in proxy and NRI mode alike: each running container with the pod's
//! grace period (StopContainer's timeout), then the sandbox. kubelet sees a
//! dead sandbox and recreates it; admission keeps a BE pod off the node while
//! the pressure lasts. Disk reclaim is kubelet's garbage collection through
//! CRI: exited containers removed, then images no container uses (never a
//! pinned one, nor the runtime's sandbox image).

use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use qoslet_eviction::evictor::{BoxFuture, EvictError, EvictRequest, Evicted, Evictor, Reclaimed};
use qoslet_proto::cri;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

type Client = cri::runtime_service_client::RuntimeServiceClient<Channel>;

/// Evicts through the runtime's CRI socket.
pub struct CriEvictor {
    channel: Channel,
    client: Client,
    socket: PathBuf,
}

impl CriEvictor {
    /// A client of the runtime at `socket` (connected on first use).
    pub fn new(socket: PathBuf) -> Self {
        let p = socket.clone();
        let channel = Endpoint::from_static("http://localhost")
            .connect_timeout(Duration::from_secs(2))
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let p = p.clone();
                async move { UnixStream::connect(&p).await.map(TokioIo::new) }
            }));
        Self {
            client: Client::new(channel.clone()),
            channel,
            socket,
        }
    }

    /// Stops every running container with the grace period (all of them,
    /// to the end: an error or a slow one never cancels the others), then
    /// the sandbox, which force-stops whatever is left.
    async fn stop(client: Client, req: EvictRequest) -> Result<Evicted, tonic::Status> {
        let mut c = client.clone();
        let listed = c
            .list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    pod_sandbox_id: req.sandbox_id.clone(),
                    ..Default::default()
                }),
            })
            .await;
        let grace = req.grace_seconds.max(0);
        let mut stops = tokio::task::JoinSet::new();
        for ctr in listed
            .map(|l| l.into_inner().containers)
            .unwrap_or_default()
        {
            if ctr.state != cri::ContainerState::ContainerRunning as i32 {
                continue;
            }
            let mut c = client.clone();
            stops.spawn(async move {
                let r = c
                    .stop_container(cri::StopContainerRequest {
                        container_id: ctr.id.clone(),
                        timeout: grace,
                    })
                    .await;
                (ctr.id, r)
            });
        }
        while let Some(r) = stops.join_next().await {
            if let Ok((id, Err(st))) = r {
                if st.code() != tonic::Code::NotFound {
                    tracing::warn!(container = %id, error = %st.message(), "StopContainer failed; StopPodSandbox follows");
                }
            }
        }
        match c
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: req.sandbox_id.clone(),
            })
            .await
        {
            Ok(_) => Ok(Evicted::Stopped),
            Err(st) if st.code() == tonic::Code::NotFound => Ok(Evicted::Gone),
            Err(st) => Err(st),
        }
    }
}

impl CriEvictor {
    /// kubelet's disk reclaim through CRI: every exited container removed,
    /// then every image no container uses, except pinned ones and the
    /// runtime's sandbox (pause) image.
    async fn garbage_collect(channel: Channel) -> Reclaimed {
        let mut out = Reclaimed::default();
        let mut c = Client::new(channel.clone());
        let containers = match c
            .list_containers(cri::ListContainersRequest { filter: None })
            .await
        {
            Ok(r) => r.into_inner().containers,
            Err(st) => {
                out.errors.push(format!("ListContainers: {}", st.message()));
                return out;
            }
        };
        let mut in_use = std::collections::BTreeSet::new();
        for ctr in containers {
            if ctr.state == cri::ContainerState::ContainerExited as i32 {
                match c
                    .remove_container(cri::RemoveContainerRequest {
                        container_id: ctr.id.clone(),
                    })
                    .await
                {
                    Ok(_) => {
                        out.containers += 1;
                        continue;
                    }
                    Err(st) => {
                        out.errors
                            .push(format!("RemoveContainer {}: {}", ctr.id, st.message()))
                    }
                }
            }
            in_use.insert(ctr.image_ref.clone());
            if let Some(spec) = &ctr.image {
                in_use.insert(spec.image.clone());
            }
        }
        // the sandbox image, from the runtime's own config (containerd's
        // verbose Status), is never removed: sandboxes use it, not containers
        let sandbox_image = c
            .status(cri::StatusRequest { verbose: true })
            .await
            .ok()
            .and_then(|r| {
                let info = r.into_inner().info;
                let cfg: serde_json::Value = serde_json::from_str(info.get("config")?).ok()?;
                cfg.get("sandboxImage")?.as_str().map(String::from)
            });
        let mut img = cri::image_service_client::ImageServiceClient::new(channel);
        let images = match img
            .list_images(cri::ListImagesRequest { filter: None })
            .await
        {
            Ok(r) => r.into_inner().images,
            Err(st) => {
                out.errors.push(format!("ListImages: {}", st.message()));
                return out;
            }
        };
        for i in images {
            let names: Vec<&String> = std::iter::once(&i.id)
                .chain(i.repo_tags.iter())
                .chain(i.repo_digests.iter())
                .collect();
            let used = names.iter().any(|n| in_use.contains(*n));
            let sandbox = sandbox_image.as_ref().is_some_and(|s| names.contains(&s));
            if used || sandbox || i.pinned {
                continue;
            }
            match img
                .remove_image(cri::RemoveImageRequest {
                    image: Some(cri::ImageSpec {
                        image: i.id.clone(),
                        ..Default::default()
                    }),
                })
                .await
            {
                Ok(_) => out
                    .images
                    .push(i.repo_tags.first().cloned().unwrap_or(i.id.clone())),
                Err(st) => out
                    .errors
                    .push(format!("RemoveImage {}: {}", i.id, st.message())),
            }
        }
        out
    }
}

impl Evictor for CriEvictor {
    fn name(&self) -> &'static str {
        "cri"
    }

    fn evict<'a>(&'a self, req: &'a EvictRequest) -> BoxFuture<'a, Result<Evicted, EvictError>> {
        Box::pin(async move {
            // the stop runs to its end on its own task: past the deadline it
            // is reported as still stopping, never cancelled halfway
            let deadline = Duration::from_secs(req.grace_seconds.max(0) as u64 + 10);
            let mut task = tokio::spawn(Self::stop(self.client.clone(), req.clone()));
            match tokio::time::timeout(deadline, &mut task).await {
                Ok(Ok(Ok(e))) => Ok(e),
                Ok(Ok(Err(st))) => Err(EvictError {
                    pod: format!("{}/{}", req.namespace, req.name),
                    reason: format!(
                        "{} ({}): {}",
                        self.socket.display(),
                        st.code(),
                        st.message()
                    ),
                }),
                Ok(Err(_)) => Err(EvictError {
                    pod: format!("{}/{}", req.namespace, req.name),
                    reason: "the stop failed (panicked)".into(),
                }),
                Err(_) => Ok(Evicted::Stopping),
            }
        })
    }

    fn reclaim_disk(&self) -> Option<BoxFuture<'_, Reclaimed>> {
        let channel = self.channel.clone();
        Some(Box::pin(async move {
            // to its end on its own task, within a minute
            let task = tokio::spawn(Self::garbage_collect(channel));
            match tokio::time::timeout(Duration::from_secs(60), task).await {
                Ok(Ok(r)) => r,
                _ => Reclaimed {
                    errors: vec!["garbage collection did not finish within 60 s".into()],
                    ..Default::default()
                },
            }
        }))
    }
}
