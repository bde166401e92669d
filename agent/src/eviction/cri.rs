//! The CRI evictor: stops an evicted pod at the runtime, as kubelet's kill
//! does, in proxy and NRI mode alike: each running container with the pod's
//! grace period (StopContainer's timeout), then the sandbox. kubelet sees a
//! dead sandbox and recreates it; admission keeps a BE pod off the node while
//! the pressure lasts. Disk reclaim is kubelet's garbage collection through
//! CRI: exited containers removed but the newest of each (pod, container
//! name), then images no container uses (never a pinned one, the runtime's
//! sandbox image, nor one first seen within `imageMinimumGCAge`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use qoslet_eviction::evictor::{BoxFuture, EvictError, EvictRequest, Evicted, Evictor, Reclaimed};
use qoslet_proto::cri;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

type Client = cri::runtime_service_client::RuntimeServiceClient<Channel>;

/// Images by id, with when qoslet first saw each (kubelet's image
/// manager's `firstDetected`).
type FirstSeen = Arc<Mutex<HashMap<String, Instant>>>;

/// Evicts through the runtime's CRI socket.
pub struct CriEvictor {
    channel: Channel,
    client: Client,
    socket: PathBuf,
    first_seen: FirstSeen,
    image_min_age: Duration,
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
            first_seen: Arc::default(),
            image_min_age: Duration::from_secs(120),
        }
    }

    /// kubelet's `imageMinimumGCAge`: an image first seen more lately than
    /// this is not removed.
    pub fn with_image_minimum_gc_age(mut self, age: Duration) -> Self {
        self.image_min_age = age;
        self
    }

    /// Notes the images the runtime has now, every `every` (kubelet's image
    /// manager detects them every 5 min): an image's age counts from when it
    /// was first seen, at the latest the disk reclaim that lists it.
    pub fn watch_images(
        &self,
        every: Duration,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let (channel, seen) = (self.channel.clone(), self.first_seen.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = shutdown.changed() => return,
                }
                let mut img = cri::image_service_client::ImageServiceClient::new(channel.clone());
                if let Ok(r) = img
                    .list_images(cri::ListImagesRequest { filter: None })
                    .await
                {
                    note_images(&seen, &r.into_inner().images);
                }
            }
        })
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

/// Records the images listed now (first sighting: now), forgets the gone.
fn note_images(seen: &FirstSeen, images: &[cri::Image]) {
    let now = Instant::now();
    let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
    s.retain(|id, _| images.iter().any(|i| &i.id == id));
    for i in images {
        s.entry(i.id.clone()).or_insert(now);
    }
}

/// The exited containers kubelet's garbage collection removes: per pod
/// (UID) and container name, all but the newest (kubelet keeps one dead
/// instance of each container of a pod, `MaxPerPodContainer` 1: a pod's
/// restart policy, back-off and `logs --previous` read it).
fn removable(containers: &[cri::Container], pod_uid: &HashMap<String, String>) -> Vec<String> {
    let mut groups: HashMap<(String, String), Vec<&cri::Container>> = HashMap::new();
    for c in containers
        .iter()
        .filter(|c| c.state == cri::ContainerState::ContainerExited as i32)
    {
        let uid = pod_uid
            .get(&c.pod_sandbox_id)
            .cloned()
            .unwrap_or_else(|| c.pod_sandbox_id.clone());
        let name = c
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        groups.entry((uid, name)).or_default().push(c);
    }
    let mut out = Vec::new();
    for (_, mut g) in groups {
        g.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then_with(|| b.id.cmp(&a.id))
        });
        out.extend(g.into_iter().skip(1).map(|c| c.id.clone()));
    }
    out.sort();
    out
}

impl CriEvictor {
    /// kubelet's disk reclaim through CRI: exited containers beyond the
    /// newest of each (pod, container name) removed, then every image no
    /// container uses, except pinned ones, the runtime's sandbox image and
    /// images first seen within the minimum age.
    async fn garbage_collect(channel: Channel, seen: FirstSeen, min_age: Duration) -> Reclaimed {
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
        let pod_uid: HashMap<String, String> = match c
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
        {
            Ok(r) => r
                .into_inner()
                .items
                .into_iter()
                .filter_map(|p| Some((p.id, p.metadata?.uid)))
                .collect(),
            Err(st) => {
                out.errors.push(format!("ListPodSandbox: {}", st.message()));
                return out;
            }
        };
        let remove: std::collections::BTreeSet<String> =
            removable(&containers, &pod_uid).into_iter().collect();
        let mut in_use = std::collections::BTreeSet::new();
        for ctr in containers {
            if remove.contains(&ctr.id) {
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
        note_images(&seen, &images);
        let young: std::collections::BTreeSet<String> = {
            let s = seen.lock().unwrap_or_else(|e| e.into_inner());
            s.iter()
                .filter(|(_, at)| at.elapsed() < min_age)
                .map(|(id, _)| id.clone())
                .collect()
        };
        for i in images {
            if young.contains(&i.id) {
                continue;
            }
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

    fn writable_layers(
        &self,
    ) -> Option<BoxFuture<'_, std::collections::HashMap<String, qoslet_eviction::FsUse>>> {
        Some(Box::pin(async move {
            let mut client = self.client.clone();
            let mut out: std::collections::HashMap<String, qoslet_eviction::FsUse> =
                std::collections::HashMap::new();
            let Ok(r) = client
                .list_container_stats(cri::ListContainerStatsRequest::default())
                .await
            else {
                return out;
            };
            for s in r.into_inner().stats {
                let (Some(attrs), Some(layer)) = (s.attributes, s.writable_layer) else {
                    continue;
                };
                let u = out.entry(attrs.id).or_default();
                u.bytes = u
                    .bytes
                    .saturating_add(layer.used_bytes.map_or(0, |v| v.value as i64));
                u.inodes = u
                    .inodes
                    .saturating_add(layer.inodes_used.map_or(0, |v| v.value as i64));
            }
            out
        }))
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
        let (channel, seen, min_age) = (
            self.channel.clone(),
            self.first_seen.clone(),
            self.image_min_age,
        );
        Some(Box::pin(async move {
            // to its end on its own task, within a minute
            let task = tokio::spawn(Self::garbage_collect(channel, seen, min_age));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ctr(
        id: &str,
        sandbox: &str,
        name: &str,
        created: i64,
        state: cri::ContainerState,
    ) -> cri::Container {
        cri::Container {
            id: id.into(),
            pod_sandbox_id: sandbox.into(),
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            created_at: created,
            state: state as i32,
            ..Default::default()
        }
    }

    /// kubelet keeps the newest dead instance of each container of a pod
    /// (across its sandboxes, by pod UID): a completed container is not run
    /// again, a crash loop keeps its back-off, `logs --previous` its log.
    #[test]
    fn the_newest_dead_container_of_each_is_kept() {
        use cri::ContainerState::{ContainerExited as Exited, ContainerRunning as Running};
        let pods = HashMap::from([
            ("sb1".to_string(), "uid-a".to_string()),
            ("sb2".to_string(), "uid-a".to_string()),
            ("sb3".to_string(), "uid-b".to_string()),
        ]);
        let containers = [
            ctr("a-app-1", "sb1", "app", 1, Exited),
            ctr("a-app-2", "sb2", "app", 2, Exited),
            ctr("a-app-3", "sb2", "app", 3, Running),
            ctr("a-init-1", "sb1", "init", 1, Exited),
            ctr("b-job-1", "sb3", "job", 5, Exited),
            ctr("b-job-0", "sb3", "job", 4, Exited),
            ctr("orphan-1", "gone", "x", 1, Exited),
            ctr("orphan-2", "gone", "x", 2, Exited),
        ];
        assert_eq!(
            removable(&containers, &pods),
            ["a-app-1", "b-job-0", "orphan-1"]
        );
    }
}
