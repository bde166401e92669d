//! What an isolation event can fail with (the front end's failure policy
//! decides what a failure means for the call: fail-open logs it and passes).

use qoslet_cgroups::CgroupError;

#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    /// A cgroup setting the kernel refused (the first of the event's; every
    /// other was still tried, and each is recorded in the store).
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// The container could not join its class's resctrl group.
    #[error("resctrl group {group}: {source}")]
    Resctrl {
        group: String,
        #[source]
        source: CgroupError,
    },
}
