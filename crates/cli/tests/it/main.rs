//! airlock's end-to-end tests, one binary: the real `airlock` binary on the real kernel, each
//! file a module (`cargo test -p airlock --test it -- server::`). One binary links once;
//! tests that start sandboxes hold `common::serial()` (or go through `common::run`, which
//! does), as they did in their own binaries, and count only the sandboxes of the airlock
//! processes they started.

mod common;

mod answers;
mod approvals;
mod background;
mod cli;
mod credentials;
mod deploy;
mod docs;
mod egress;
mod environments;
mod eval;
mod faults;
mod function;
mod jail;
mod kernel;
mod limits;
mod mcp;
mod openapi;
mod outputs;
mod pickle;
mod pod;
mod pool;
mod replicas;
mod results;
mod server;
mod sessions;
mod snapshots;
mod streaming;
mod telemetry;
mod tenants;
mod tools;
mod volumes;
mod zygote;
