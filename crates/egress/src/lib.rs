//! The egress leash: which host names and ports a sandbox's proxy may connect to, which
//! addresses it may reach once it has resolved a name itself (the policy is
//! `airlock-api`'s words, checked by [`policy`]), and the proxy that serves one sandbox's
//! listener under it ([`proxy`]), setting credentials on the way ([`intercept`]).
//!
//! The default policy allows nothing.
#![forbid(unsafe_code)]

mod answer;
pub mod credentials;
mod framing;
mod head;
pub mod intercept;
mod leash;
mod pipe;
pub mod policy;
pub mod proxy;
mod relay;
mod request;
pub mod scrub;
mod side;
mod stop;

pub use airlock_api::egress::{
    host_rule_covers, normalize, EgressPolicy, HostRule, RangeRule, Usage,
};
pub use credentials::{Credential, CredentialRecord, SetHeader};
pub use intercept::Interception;
pub use leash::{ConnectionRecord, Leash, Observer, Settings};
pub use policy::{special, Checks, Denied, Target};
pub use proxy::Serving;
