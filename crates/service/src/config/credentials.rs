//! `[credentials.NAME]`: what the egress proxy sets on requests to their hosts, and where
//! each value comes from (never the configuration itself).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[credentials.NAME]`: the hosts a credential applies to and the headers the proxy sets
/// on every request to them. Values are never written here: each names a host environment
/// variable or a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    /// Host names (exact, or `*.` and one) with their ports.
    pub hosts: Vec<airlock_egress::HostRule>,
    /// Header name to where its value comes from.
    pub headers: BTreeMap<String, CredentialValue>,
    /// PEM certificates that verify these hosts' servers instead of the host's CA bundle
    /// (an internal service's own CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
}

/// One header's value: the secret from `env` or `file` (exactly one), put in `format`
/// where `{}` is (default: the secret alone).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialValue {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    #[serde(default = "secret_alone")]
    pub format: String,
}

fn secret_alone() -> String {
    "{}".into()
}

impl CredentialValue {
    /// The header's value and the secret in it, read now; errors name the source, never
    /// the value.
    pub fn read(&self) -> Result<(String, String), String> {
        let secret = airlock_tools::Secret {
            env: self.env.clone(),
            file: self.file.clone(),
        }
        .read()?;
        Ok((self.format.replacen("{}", &secret, 1), secret))
    }
}

/// What can be checked of `[credentials]` without reading a value.
pub(super) fn check(credentials: &BTreeMap<String, CredentialConfig>) -> Result<(), String> {
    for (name, c) in credentials {
        let whose = format!("credentials.{name}");
        let ok_name = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !ok_name {
            return Err(format!(
                "{whose}: a name of lower-case letters, digits, `_` and `-`"
            ));
        }
        airlock_egress::credentials::check_hosts(&whose, &c.hosts)?;
        if c.headers.is_empty() {
            return Err(format!("{whose}: name the header(s) it sets"));
        }
        for (header, value) in &c.headers {
            if value.env.is_some() == value.file.is_some() {
                return Err(format!(
                    "{whose}.headers.{header}: give `env` or `file` (values are never \
                     written in the configuration)"
                ));
            }
            if value.format.matches("{}").count() != 1 {
                return Err(format!(
                    "{whose}.headers.{header}: `format` must have one `{{}}` (where the \
                     secret goes)"
                ));
            }
        }
    }
    let names: Vec<&String> = credentials.keys().collect();
    for (i, a) in names.iter().enumerate() {
        for b in &names[i + 1..] {
            let (ca, cb) = (&credentials[*a], &credentials[*b]);
            let overlap = ca.hosts.iter().any(|x| {
                cb.hosts.iter().any(|y| {
                    x.ports.iter().any(|p| y.ports.contains(p))
                        && (airlock_egress::host_rule_covers(&x.host, &y.host)
                            || airlock_egress::host_rule_covers(&y.host, &x.host))
                })
            });
            if overlap {
                return Err(format!(
                    "credentials `{a}` and `{b}` apply to the same host and port: one \
                     request can carry one credential"
                ));
            }
        }
    }
    Ok(())
}
