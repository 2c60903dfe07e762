//! The HTTP adapters: the guard every request passes ([`guard`]), then one handler per
//! route, each a scope check and a call into [`crate::service`]. The route table that maps
//! paths to them is [`crate::routes`].

pub(crate) mod environments;
pub(crate) mod eval;
pub(crate) mod executions;
pub(crate) mod guard;
pub(crate) mod pickle;
pub(crate) mod sessions;
pub(crate) mod status;
pub(crate) mod tools;
