//! Block I/O limits of a class's `blkioQOS` on the pod cgroup.

use super::*;

/// The class's block I/O limits (`blkioQOS`), per device the host has.
pub(super) fn blkio(class: QosClass, ctx: &Context, d: &mut PodDecision) {
    let q = &ctx.policy.of(class).blkio_qos;
    if !q.enable {
        return;
    }
    if !ctx.features.blkio_throttle {
        d.warnings.push(Warning::NoBlkio);
        return;
    }
    // volume groups and pod volumes need the pod's volume spec, which CRI does not carry
    for b in q.blocks.iter().filter(|b| b.block_type == "device") {
        let Some(device) = ctx.devices.get(&b.name) else {
            d.warnings.push(Warning::NotABlockDevice {
                name: b.name.clone(),
            });
            continue;
        };
        let limits = b.limits();
        if limits == qoslet_cgroups::IoLimits::default() {
            continue;
        }
        d.decisions.push(cgroup(
            Knob::IoLimit {
                device: *device,
                limits,
            },
            format!("{} blkioQOS for {}", class.as_str(), b.name),
        ));
    }
}
