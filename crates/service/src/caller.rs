//! Who a request comes from, as every layer sees it: the key that authenticated it
//! ([`Caller`]), the id its answer and log lines carry ([`RequestId`]), and the scope check
//! ([`require`]), which the HTTP guard makes once per request with the scope the route table
//! names (over stdio the one local key has every scope). The HTTP guard and the MCP
//! transports make them; services only read them.

use std::sync::Arc;

use crate::config::Scope;
use crate::error::Error;
use crate::keys::Key;

/// The request's id, also sent back as `x-request-id`.
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

/// The authenticated key.
#[derive(Clone, Debug)]
pub struct Caller(pub Arc<Key>);

/// 403 unless the caller's key has `scope`.
pub fn require(caller: &Caller, scope: Scope) -> Result<(), Error> {
    if caller.0.allows(scope) {
        Ok(())
    } else {
        Err(Error::forbidden(
            format!("this key lacks the {scope:?} scope").to_lowercase(),
        ))
    }
}
