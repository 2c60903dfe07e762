//! What a result says of its sandbox's isolation: what the kernel enforced, as the sandbox
//! reported it, or what its policy asked for when it never reported; and the egress policy it
//! ran under.

use airlock_sandbox::{CgroupVersion, LandlockState, Policy};

/// What the kernel enforced, as the sandbox reported it.
pub(crate) fn reported(iso: &airlock_sandbox::Isolation) -> airlock_api::Isolation {
    airlock_api::Isolation {
        namespaces: iso.namespaces.clone(),
        uid: iso.uid,
        network: "none".into(),
        egress: None,
        filesystem: "read_only".into(),
        seccomp: if iso.seccomp { "enforced" } else { "disabled" }.into(),
        landlock: match iso.landlock.state {
            LandlockState::FullyEnforced => "fully_enforced",
            LandlockState::PartiallyEnforced => "partially_enforced",
            LandlockState::NotEnforced => "not_enforced",
            LandlockState::Disabled => "disabled",
        }
        .into(),
        landlock_abi: iso.landlock.abi,
        cgroup: match iso.cgroup {
            Some(CgroupVersion::V1) => "v1",
            Some(CgroupVersion::V2) => "v2",
            None => "disabled",
        }
        .into(),
        no_new_privs: iso.no_new_privs,
        capabilities: if iso.capabilities_dropped {
            Vec::new()
        } else {
            vec!["unknown".into()]
        },
        downgraded: iso.downgraded.clone(),
    }
}

/// What a policy asks for, for results of sandboxes that never reported.
pub(crate) fn planned(policy: &Policy) -> airlock_api::Isolation {
    reported(&airlock_sandbox::Isolation::planned(policy, None))
}

/// Reports the egress policy a sandbox ran under, when it had one.
pub(crate) fn with_egress(iso: &mut airlock_api::Isolation, leash: Option<&airlock_egress::Leash>) {
    if let Some(leash) = leash {
        iso.network = "egress_proxy".into();
        iso.egress = Some(leash.policy().clone());
    }
}
