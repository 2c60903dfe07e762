//! What the operator decides: the interpreter, default limits, ceilings and downgrades.

use std::path::PathBuf;

use airlock_api::{Limits, LimitsRequest};
use serde::{Deserialize, Serialize};

/// A protection an operator may explicitly switch off, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    Seccomp,
    Landlock,
    Cgroups,
}

impl Mechanism {
    pub const ALL: [Mechanism; 3] = [Mechanism::Seccomp, Mechanism::Landlock, Mechanism::Cgroups];

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Seccomp => "seccomp",
            Mechanism::Landlock => "landlock",
            Mechanism::Cgroups => "cgroups",
        }
    }
}

impl std::str::FromStr for Mechanism {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Mechanism::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!("unknown mechanism {s:?} (expected one of: seccomp, landlock, cgroups)")
            })
    }
}

/// Engine settings. [`Default`] is what `airlock run` and `airlock serve` use out of the box.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// The host's Python interpreter; it and its libraries are mounted read-only.
    pub python: PathBuf,
    /// Limits of an execution that asks for nothing.
    pub defaults: Limits,
    /// The most any execution may ask for.
    pub ceilings: Limits,
    /// Largest code accepted, in bytes.
    pub max_code_bytes: u64,
    /// Largest code size anyone may raise `max_code_bytes` to.
    pub max_code_bytes_ceiling: u64,
    /// Largest standard input accepted, in bytes.
    pub max_stdin_bytes: u64,
    /// Largest total of input files, in bytes (also bounded by the disk limit).
    pub max_files_bytes: u64,
    /// Largest JSON result the sandbox may send back, in bytes.
    pub max_result_bytes: u64,
    /// `RLIMIT_NOFILE` of the program.
    pub open_files: u64,
    /// CPU bandwidth of one sandbox, in thousandths of a core.
    pub cpu_millicores: u32,
    /// Mechanisms switched off by name; every result says so in `isolation.downgraded`.
    pub downgrade: Vec<Mechanism>,
}

const MIB: u64 = 1 << 20;
/// Room for an error's message and traceback beyond the result limit.
pub(crate) const RESPONSE_OVERHEAD: u64 = 128 * 1024;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            python: PathBuf::from("/usr/bin/python3"),
            defaults: Limits {
                timeout_ms: 30_000,
                memory_mb: 512,
                cpu_ms: 30_000,
                pids: 64,
                disk_mb: 256,
                output_bytes: MIB,
            },
            ceilings: Limits {
                timeout_ms: 600_000,
                memory_mb: 8192,
                cpu_ms: 600_000,
                pids: 1024,
                disk_mb: 4096,
                output_bytes: 64 * MIB,
            },
            max_code_bytes: MIB,
            max_code_bytes_ceiling: 16 * MIB,
            max_stdin_bytes: 16 * MIB,
            max_files_bytes: 64 * MIB,
            max_result_bytes: MIB,
            open_files: 256,
            cpu_millicores: 1000,
            downgrade: Vec::new(),
        }
    }
}

impl EngineConfig {
    /// The most memory one execution's result can hold, under `limits`: both captured
    /// streams as written, and the sandbox's response (result, error, outputs, files) once
    /// parsed and serialized again (twice its bytes: numbers and escapes can grow a little
    /// when written back).
    pub fn result_bytes(&self, limits: &Limits) -> u64 {
        let response = self.response_limit();
        limits
            .output_bytes
            .saturating_mul(2)
            .saturating_add(response.saturating_mul(2))
    }

    /// The most a runner's response may hold: the result limit, and room for an error's
    /// message and traceback.
    pub(crate) fn response_limit(&self) -> u64 {
        self.max_result_bytes + RESPONSE_OVERHEAD
    }
}

/// A request the operator's settings do not allow.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LimitError {
    #[error("limit {name} = {value} is above the operator's ceiling of {ceiling}")]
    AboveCeiling {
        name: &'static str,
        value: u64,
        ceiling: u64,
    },
    #[error("limit {name} must be greater than zero")]
    Zero { name: &'static str },
}

impl EngineConfig {
    /// Fills what a request left out with the defaults and checks everything against the
    /// ceilings. Nothing runs when this fails.
    pub fn resolve_limits(&self, req: &LimitsRequest) -> Result<Limits, LimitError> {
        let d = &self.defaults;
        let c = &self.ceilings;
        let pick = |name, asked: Option<u64>, default: u64, ceiling: u64| {
            let value = asked.unwrap_or(default);
            if value == 0 {
                Err(LimitError::Zero { name })
            } else if value > ceiling {
                Err(LimitError::AboveCeiling {
                    name,
                    value,
                    ceiling,
                })
            } else {
                Ok(value)
            }
        };
        Ok(Limits {
            timeout_ms: pick("timeout_ms", req.timeout_ms, d.timeout_ms, c.timeout_ms)?,
            memory_mb: pick("memory_mb", req.memory_mb, d.memory_mb, c.memory_mb)?,
            cpu_ms: pick("cpu_ms", req.cpu_ms, d.cpu_ms, c.cpu_ms)?,
            pids: pick(
                "pids",
                req.pids.map(u64::from),
                u64::from(d.pids),
                u64::from(c.pids),
            )? as u32,
            disk_mb: pick("disk_mb", req.disk_mb, d.disk_mb, c.disk_mb)?,
            output_bytes: pick(
                "output_bytes",
                req.output_bytes,
                d.output_bytes,
                c.output_bytes,
            )?,
        })
    }

    /// The code-size limit for one execution: `raise_to` may lift it up to its ceiling.
    pub fn code_limit(&self, raise_to: Option<u64>) -> Result<u64, LimitError> {
        match raise_to {
            None => Ok(self.max_code_bytes),
            Some(0) => Err(LimitError::Zero {
                name: "max_code_bytes",
            }),
            Some(v) if v > self.max_code_bytes_ceiling => Err(LimitError::AboveCeiling {
                name: "max_code_bytes",
                value: v,
                ceiling: self.max_code_bytes_ceiling,
            }),
            Some(v) => Ok(v),
        }
    }

    pub fn is_downgraded(&self, m: Mechanism) -> bool {
        self.downgrade.contains(&m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_what_is_left_out() {
        let cfg = EngineConfig::default();
        let limits = cfg
            .resolve_limits(&LimitsRequest {
                timeout_ms: Some(500),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(limits.timeout_ms, 500);
        assert_eq!(limits.memory_mb, cfg.defaults.memory_mb);
        assert_eq!(limits.output_bytes, cfg.defaults.output_bytes);
    }

    #[test]
    fn ceilings_and_zero_are_refused_with_the_limit_named() {
        let cfg = EngineConfig::default();
        let req = LimitsRequest {
            memory_mb: Some(9000),
            ..Default::default()
        };
        assert_eq!(
            cfg.resolve_limits(&req),
            Err(LimitError::AboveCeiling {
                name: "memory_mb",
                value: 9000,
                ceiling: 8192
            })
        );
        let req = LimitsRequest {
            pids: Some(0),
            ..Default::default()
        };
        assert_eq!(
            cfg.resolve_limits(&req),
            Err(LimitError::Zero { name: "pids" })
        );
    }

    #[test]
    fn defaults_are_within_ceilings() {
        let cfg = EngineConfig::default();
        let from_defaults = cfg.resolve_limits(&LimitsRequest::default()).unwrap();
        assert_eq!(from_defaults, cfg.defaults);
        assert!(cfg.max_code_bytes <= cfg.max_code_bytes_ceiling);
    }

    #[test]
    fn code_limit_can_be_raised_only_to_its_ceiling() {
        let cfg = EngineConfig::default();
        assert_eq!(cfg.code_limit(None), Ok(MIB));
        assert_eq!(cfg.code_limit(Some(2 * MIB)), Ok(2 * MIB));
        assert!(cfg.code_limit(Some(17 * MIB)).is_err());
    }

    #[test]
    fn mechanisms_parse_by_name_only() {
        assert_eq!("landlock".parse::<Mechanism>(), Ok(Mechanism::Landlock));
        assert!("Landlock".parse::<Mechanism>().is_err());
        assert!("network"
            .parse::<Mechanism>()
            .unwrap_err()
            .contains("seccomp, landlock, cgroups"));
    }
}
