//! The syscall filter, kept as data: `seccomp/x86_64.json`, one entry per syscall with the reason
//! it is there (the format is seccompiler's, as in firecracker's `resources/seccomp`).
//!
//! The file holds several filters that are all installed; the kernel runs every one on each call
//! and the most severe answer wins, so a later filter (the program's own included) can only add
//! restrictions:
//! - `allow`: the default-deny allow-list; any other call fails with `ENOSYS`.
//! - `kill`: calls only an escape attempt makes; the process is killed with `SIGSYS`.
//! - `noop`: durability and cache calls answered with success without running (the writable
//!   file system is a tmpfs; on the read-only host files they would reach the host's disk).
//! - `refused_flags`: `O_DIRECT`, directory notifications, leases and `RWF_NOWAIT` (EINVAL).
//! - `protect_init`: calls that would reach the sandbox's init by pid (EPERM).
//! - `socket_families`, `socket_types`, `socket_protocols`: only local sockets and TCP/UDP,
//!   never raw, each refusal with its own errno.
//! - `no_clone3`, `no_setns`: `clone3` fails with `ENOSYS` (its flags are in memory the filter
//!   cannot read; the C library falls back to `clone`), joining namespaces kills the process.
//!   Apart and last because a zygote clones each child into its cgroup with `clone3` and the
//!   child joins its jail's namespaces: the zygote installs every other filter once, its
//!   children inherit them and add only these two ([`Filters::install_inherited`],
//!   [`Filters::install_last`]). A cold sandbox installs all of them, in the same order.
//!
//! Before those, a hand-written guard checks the architecture and kills on x32 syscall numbers
//! (`nr & 0x4000_0000`), which would otherwise reach the x86_64 table under another number.
//!
//! All but the last two are installed as one program (`merge`), the last two as another
//! after it, in a cold sandbox as in a zygote's child (the same two programs in both): the
//! kernel prepares and runs two filters instead of eleven, and answers every call exactly as
//! it would with the eleven.

use seccompiler::{sock_filter, BpfProgram};

use crate::seccomp_profile::{
    AND_K, AUDIT_ARCH_X86_64, FILTERS, JA, JEQ_K, JGE_K, JGT_K, JSET_K, LD_W_ABS, RET_K,
};

/// The profile's programs, compiled by `build.rs` (see `seccomp_profile`).
static COMPILED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/seccomp_filters.bin"));

/// The profile source for the architecture this crate was built for.
#[cfg(target_arch = "x86_64")]
pub const PROFILE_JSON: &str = include_str!("../seccomp/x86_64.json");
#[cfg(not(target_arch = "x86_64"))]
pub const PROFILE_JSON: &str = "";

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("no seccomp profile for this architecture ({0})")]
    UnsupportedArch(&'static str),
    #[error("seccomp profile is malformed: {0}")]
    Profile(String),
    #[error("installing seccomp filter {name}: {source}")]
    Install {
        name: &'static str,
        source: seccompiler::Error,
    },
}

/// The compiled filters, in installation order, and the merged programs that are installed.
#[derive(Debug)]
pub struct Filters {
    parts: Vec<(&'static str, BpfProgram)>,
    /// Every filter but the last `HELD_BACK`, as one program.
    inherited: BpfProgram,
    /// The last `HELD_BACK`, as one program.
    last: BpfProgram,
}

/// The filters a zygote's children install themselves, once in their jails (`no_clone3`,
/// `no_setns`): the zygote uses both calls for them.
const HELD_BACK: usize = 2;

/// The filters, ready once for this process (see [`Filters::shared`]).
static SHARED: std::sync::OnceLock<Result<Filters, String>> = std::sync::OnceLock::new();

impl Filters {
    /// The embedded programs, decoded and merged the first time this process asks: a host
    /// does it once and hands the programs to each sandbox's init (`encode`).
    pub fn shared() -> Result<&'static Filters, SeccompError> {
        SHARED
            .get_or_init(|| Filters::compile().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| SeccompError::Profile(e.clone()))
    }

    /// The programs, in order, as bytes: per program its length, then each instruction
    /// (code, jt, jf, k; little-endian).
    pub(crate) fn encode(&self) -> Vec<u8> {
        crate::seccomp_profile::encode(&self.parts)
    }

    /// What `encode` wrote, for the filters this crate installs (their names are its own).
    pub(crate) fn decode(bytes: &[u8]) -> Result<Filters, SeccompError> {
        let bad = || SeccompError::Profile("the compiled filters are malformed".into());
        let mut at = 0;
        let u32_at = |at: &mut usize| -> Result<u32, SeccompError> {
            let b = bytes.get(*at..*at + 4).ok_or_else(bad)?;
            *at += 4;
            Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let names: Vec<&'static str> = std::iter::once("arch_and_x32").chain(FILTERS).collect();
        if u32_at(&mut at)? as usize != names.len() {
            return Err(bad());
        }
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let n = u32_at(&mut at)? as usize;
            let body = bytes
                .get(at..at + n.checked_mul(8).ok_or_else(bad)?)
                .ok_or_else(bad)?;
            at += n * 8;
            let prog = body
                .chunks_exact(8)
                .map(|c| sock_filter {
                    code: u16::from_le_bytes([c[0], c[1]]),
                    jt: c[2],
                    jf: c[3],
                    k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
                })
                .collect();
            out.push((name, prog));
        }
        if at != bytes.len() {
            return Err(bad());
        }
        Filters::new(out)
    }

    fn new(parts: Vec<(&'static str, BpfProgram)>) -> Result<Self, SeccompError> {
        let held = parts
            .len()
            .checked_sub(HELD_BACK)
            .filter(|&n| n > 0)
            .ok_or_else(|| SeccompError::Profile("too few filters".into()))?;
        let inherited = merge(&parts[..held])?;
        let last = merge(&parts[held..])?;
        Ok(Filters {
            parts,
            inherited,
            last,
        })
    }

    /// The profile's programs, as `build.rs` compiled them.
    pub fn compile() -> Result<Self, SeccompError> {
        if !cfg!(target_arch = "x86_64") {
            return Err(SeccompError::UnsupportedArch(std::env::consts::ARCH));
        }
        Filters::decode(COMPILED)
    }

    /// Installs every filter on the calling thread: all but the last as one program, then the
    /// last, as a zygote and its child do between them.
    pub fn install(&self) -> Result<(), SeccompError> {
        self.install_inherited()?;
        self.install_last()
    }

    /// Every filter but the last two, as one program: what a zygote installs for its
    /// children.
    pub fn install_inherited(&self) -> Result<(), SeccompError> {
        Self::apply("all but no_clone3 and no_setns", &self.inherited)
    }

    /// The last two (`no_clone3`, `no_setns`) as one program, once a zygote's child has
    /// joined its jail.
    pub fn install_last(&self) -> Result<(), SeccompError> {
        Self::apply("no_clone3 and no_setns", &self.last)
    }

    fn apply(name: &'static str, prog: &BpfProgram) -> Result<(), SeccompError> {
        seccompiler::apply_filter(prog).map_err(|source| SeccompError::Install { name, source })
    }

    /// How many filters the profile has (the x32 guard included).
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
}

/// BPF_MAXINSNS: the longest program the kernel takes.
const MAX_INSNS: usize = 4096;
/// SECCOMP_RET_ACTION_FULL: the action of a return value, without its data.
const ACTION: u32 = 0xffff_0000;
/// How every filter starts (seccompiler's prologue, and the x32 guard's): load the
/// architecture, and unless it is this one, kill.
const ARCH_CHECK: [(u16, u8, u8, u32); 3] = [
    (LD_W_ABS, 0, 0, 4), // seccomp_data.arch
    (JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
    (RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
];

/// The kernel's order of actions: the lower, the more severe (`ACTION_ONLY` in seccomp.c,
/// a signed comparison, so that `KILL_PROCESS` comes first).
fn severity(ret: u32) -> i32 {
    (ret & ACTION) as i32
}

/// One program that answers every call as the kernel answers it with `filters` installed in
/// this order: it runs every filter and keeps the most severe answer, and among answers of the
/// same action the one of the most recently installed filter.
///
/// Each filter here starts by killing on a foreign architecture (all alike, so on one every
/// filter answers the same) and then answers "allow" or one action of its own (its errno or
/// kill), from constants. So the filters are laid end to end, sorted by that action (most
/// severe first) and, within an action, most recent first; each "allow" jumps to the next
/// filter instead of returning, and the first answer that is not "allow" is the kernel's.
/// Only the instructions seccompiler emits are accepted, all of which the kernel's per-syscall
/// cache understands, so calls every filter allows outright still skip the program.
fn merge(filters: &[(&'static str, BpfProgram)]) -> Result<BpfProgram, SeccompError> {
    let bad = |name: &str, why: &str| SeccompError::Profile(format!("filter {name}: {why}"));
    let mut order = Vec::with_capacity(filters.len());
    for (index, (name, prog)) in filters.iter().enumerate() {
        let Some(body) = prog.get(ARCH_CHECK.len()..).filter(|_| {
            prog.iter()
                .zip(&ARCH_CHECK)
                .all(|(i, (code, jt, jf, k))| (i.code, i.jt, i.jf, i.k) == (*code, *jt, *jf, *k))
        }) else {
            return Err(bad(
                name,
                "does not start by killing on a foreign architecture",
            ));
        };
        let mut action = None;
        for i in body {
            match i.code {
                LD_W_ABS | JA | JEQ_K | JGT_K | JGE_K | JSET_K | AND_K => {}
                RET_K if i.k == libc::SECCOMP_RET_ALLOW => {}
                RET_K => match action {
                    None => action = Some(severity(i.k)),
                    Some(a) if a == severity(i.k) => {}
                    Some(_) => return Err(bad(name, "answers with two actions")),
                },
                code => return Err(bad(name, &format!("instruction {code:#x}"))),
            }
        }
        let action = action.unwrap_or(severity(libc::SECCOMP_RET_ALLOW));
        order.push((action, std::cmp::Reverse(index), prog));
    }
    order.sort_by_key(|(action, recent, _)| (*action, *recent));

    let total = order.iter().map(|(_, _, p)| p.len()).sum::<usize>() + 1;
    if total > MAX_INSNS {
        return Err(SeccompError::Profile(format!(
            "the merged filter has {total} instructions, over {MAX_INSNS}"
        )));
    }
    let mut out = Vec::with_capacity(total);
    for (_, _, prog) in order {
        let next = out.len() + prog.len();
        for i in prog {
            if i.code == RET_K && i.k == libc::SECCOMP_RET_ALLOW {
                let skip = next - out.len() - 1;
                out.push(sock_filter {
                    code: JA,
                    jt: 0,
                    jf: 0,
                    k: skip as u32,
                });
            } else {
                out.push(i.clone());
            }
        }
    }
    out.push(sock_filter {
        code: RET_K,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ALLOW,
    });
    Ok(compact(out))
}

/// The same program without the detours seccompiler lays out (per allowed call: a compare,
/// two jumps, a return and an unreachable return): every jump goes as far along a chain of
/// unconditional jumps as it can reach (a conditional one at most 255 ahead), an
/// unconditional jump to a return becomes that return, and what no path reaches is left
/// out. The kernel checks, converts and JITs a program in time that grows with its length,
/// in every sandbox that installs it; the answers are the same for every input (see the
/// tests, which run both).
fn compact(prog: BpfProgram) -> BpfProgram {
    let is_jump = |code: u16| matches!(code, JEQ_K | JGT_K | JGE_K | JSET_K);
    // Where a jump to `at` ends up: past every unconditional jump, or, with a limit, as far
    // along them as `limit` allows.
    let follow = |mut at: usize, limit: usize| {
        while at < prog.len() && prog[at].code == JA {
            let next = at + 1 + prog[at].k as usize;
            if next > limit {
                break;
            }
            at = next;
        }
        at
    };
    let mut out: Vec<sock_filter> = prog.clone();
    // Targets, as indices into `prog`, of each kept instruction's jumps.
    let mut targets: Vec<(usize, usize)> = vec![(0, 0); prog.len()];
    for (pc, i) in prog.iter().enumerate() {
        if i.code == JA {
            let to = follow(pc + 1 + i.k as usize, usize::MAX);
            match prog.get(to) {
                Some(ret) if ret.code == RET_K => out[pc] = ret.clone(),
                _ => targets[pc] = (to, to),
            }
        } else if is_jump(i.code) {
            let limit = pc + 1 + 255;
            targets[pc] = (
                follow(pc + 1 + usize::from(i.jt), limit),
                follow(pc + 1 + usize::from(i.jf), limit),
            );
        }
    }
    // What a run can reach from the first instruction.
    let mut reached = vec![false; prog.len()];
    let mut stack = vec![0usize];
    while let Some(pc) = stack.pop() {
        if pc >= prog.len() || reached[pc] {
            continue;
        }
        reached[pc] = true;
        match out[pc].code {
            RET_K => {}
            JA => stack.push(targets[pc].0),
            code if is_jump(code) => stack.extend([targets[pc].0, targets[pc].1]),
            _ => stack.push(pc + 1),
        }
    }
    let mut index = vec![0usize; prog.len() + 1];
    let mut kept = 0;
    for pc in 0..prog.len() {
        index[pc] = kept;
        kept += usize::from(reached[pc]);
    }
    index[prog.len()] = kept;
    let mut compacted = Vec::with_capacity(kept);
    for pc in (0..prog.len()).filter(|&pc| reached[pc]) {
        let mut i = out[pc].clone();
        let offset = |to: usize| index[to] - index[pc] - 1;
        if i.code == JA {
            i.k = offset(targets[pc].0) as u32;
        } else if is_jump(i.code) {
            // Never further than before: only instructions between were left out.
            let short = |to| u8::try_from(offset(to)).expect("at most 255 ahead, as before");
            i.jt = short(targets[pc].0);
            i.jf = short(targets[pc].1);
        }
        compacted.push(i);
    }
    compacted
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use std::collections::BTreeMap;

    use seccompiler::TargetArch;

    use super::*;
    use crate::seccomp_profile::{compile_parts, strip_filter_comments};

    fn profile() -> serde_json::Value {
        serde_json::from_str(PROFILE_JSON).unwrap()
    }

    fn names(filter: &str) -> Vec<String> {
        profile()[filter]["filter"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["syscall"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn profile_compiles_with_every_filter() {
        let filters = Filters::compile().unwrap();
        assert_eq!(filters.len(), 1 + FILTERS.len());
    }

    #[test]
    fn allow_list_is_default_deny_and_kill_list_kills() {
        let p = profile();
        assert_eq!(
            p["allow"]["mismatch_action"],
            serde_json::json!({"errno": libc::ENOSYS})
        );
        assert_eq!(p["allow"]["filter_action"], "allow");
        assert_eq!(p["kill"]["filter_action"], "kill_process");
        assert_eq!(p["kill"]["mismatch_action"], "allow");
    }

    #[test]
    fn compiled_filters_cross_to_the_init_unchanged() {
        let filters = Filters::compile().unwrap();
        let back = Filters::decode(&filters.encode()).unwrap();
        assert_eq!(back.parts.len(), filters.parts.len());
        assert_eq!(back.inherited, filters.inherited);
        assert_eq!(back.last, filters.last);
        for ((a, pa), (b, pb)) in filters.parts.iter().zip(&back.parts) {
            assert_eq!(a, b);
            assert_eq!(pa, pb);
        }
        let bytes = filters.encode();
        assert!(Filters::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(Filters::decode(&[bytes.as_slice(), &[0]].concat()).is_err());
        assert!(Filters::decode(&[]).is_err());
    }

    #[test]
    fn dangerous_calls_are_never_allowed_and_always_killed() {
        let allowed = names("allow");
        let killed = names("kill");
        for call in [
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "keyctl",
            "add_key",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "io_uring_setup",
            "io_uring_enter",
            "kexec_load",
            "init_module",
            "finit_module",
            "mount",
            "umount2",
            "pivot_root",
            "unshare",
            "open_by_handle_at",
            "move_mount",
            "fsopen",
            "chroot",
        ] {
            assert!(!allowed.contains(&call.to_owned()), "{call} is allowed");
            assert!(killed.contains(&call.to_owned()), "{call} is not killed");
        }
        // clone3 (whose flags cannot be inspected) and setns are allowed by `allow` only so
        // that a zygote and its children can run under every other filter: `no_clone3` and
        // `no_setns`, installed last everywhere, refuse them, and nothing else.
        assert_eq!(names("no_clone3"), ["clone3"]);
        assert_eq!(
            profile()["no_clone3"]["filter_action"],
            serde_json::json!({"errno": libc::ENOSYS})
        );
        assert_eq!(FILTERS[FILTERS.len() - 2..], ["no_clone3", "no_setns"]);
        assert_eq!(names("no_setns"), ["setns"]);
        assert_eq!(profile()["no_setns"]["filter_action"], "kill_process");
        assert_eq!(FILTERS.last(), Some(&"no_setns"));
        let filters = Filters::compile().unwrap();
        assert_eq!(filters.parts.last().map(|f| f.0), Some("no_setns"));
    }

    #[test]
    fn no_syscall_is_both_conditional_and_unconditional_in_one_filter() {
        // seccompiler would silently turn such a pair into "conditional only".
        for (filter, body) in profile().as_object().unwrap() {
            let mut kinds: BTreeMap<String, (bool, bool)> = BTreeMap::new();
            for rule in body["filter"].as_array().unwrap() {
                let entry = kinds
                    .entry(rule["syscall"].as_str().unwrap().to_owned())
                    .or_default();
                if rule.get("args").is_some() {
                    entry.1 = true;
                } else {
                    entry.0 = true;
                }
            }
            for (name, (plain, cond)) in kinds {
                assert!(!(plain && cond), "{filter}: {name} is both");
            }
        }
    }

    #[test]
    fn noop_calls_are_left_out_of_the_allow_list_and_installed_after_it() {
        let allowed = names("allow");
        for call in names("noop") {
            assert!(
                !allowed.contains(&call),
                "{call} would run: it is in the allow list"
            );
        }
        let pos = |f: &str| FILTERS.iter().position(|x| *x == f).unwrap();
        assert!(pos("noop") > pos("allow"), "noop must beat allow's ENOSYS");
        assert_eq!(
            profile()["noop"]["filter_action"],
            serde_json::json!({"errno": 0})
        );
    }

    #[test]
    fn refining_filters_only_narrow_calls_the_allow_list_allows() {
        // Their errno beats "allow"; for a call `allow` leaves out, ENOSYS would compete.
        let allowed = names("allow");
        for filter in [
            "refused_flags",
            "protect_init",
            "socket_protocols",
            "socket_types",
            "socket_families",
        ] {
            for call in names(filter) {
                assert!(
                    allowed.contains(&call),
                    "{filter} narrows {call}, which is not allowed"
                );
            }
        }
    }

    /// A classic BPF machine for the instructions `merge` accepts; `load` gives a word of
    /// [`seccomp_data`] (nr, arch, instruction pointer, six arguments) by offset, or [`None`]
    /// when it is not known. [`None`] for an unknown load or instruction, or no return.
    fn exec(prog: &[sock_filter], load: impl Fn(u32) -> Option<u32>) -> Option<u32> {
        let mut a = 0u32;
        let mut pc = 0usize;
        while pc < prog.len() {
            let i = prog[pc].clone();
            pc += 1;
            let jump = |taken: bool| usize::from(if taken { i.jt } else { i.jf });
            match i.code {
                LD_W_ABS => a = load(i.k)?,
                AND_K => a &= i.k,
                JA => pc += i.k as usize,
                JEQ_K => pc += jump(a == i.k),
                JGT_K => pc += jump(a > i.k),
                JGE_K => pc += jump(a >= i.k),
                JSET_K => pc += jump(a & i.k != 0),
                RET_K => return Some(i.k),
                _ => return None,
            }
        }
        None
    }

    fn run(prog: &[sock_filter], data: &[u32; 16]) -> u32 {
        exec(prog, |k| Some(data[k as usize / 4])).expect("a program that answers")
    }

    /// What the kernel answers with these filters installed in this order (seccomp.c,
    /// [`seccomp_run_filters`]): from the most recent, the first of the most severe action.
    fn kernel(parts: &[(&'static str, BpfProgram)], data: &[u32; 16]) -> u32 {
        let mut ret = libc::SECCOMP_RET_ALLOW;
        for (_, prog) in parts.iter().rev() {
            let cur = run(prog, data);
            if severity(cur) < severity(ret) {
                ret = cur;
            }
        }
        ret
    }

    /// The kernel's [`seccomp_is_const_allow`]: whether a call is allowed whatever its
    /// arguments, which lets the kernel skip the program for it.
    fn const_allow(prog: &[sock_filter], nr: u32, arch: u32) -> bool {
        let known = |k| match k {
            0 => Some(nr),
            4 => Some(arch),
            _ => None,
        };
        exec(prog, known) == Some(libc::SECCOMP_RET_ALLOW)
    }

    const X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;

    /// Every number the profile compares an argument with, both halves, and its neighbours.
    fn interesting_values() -> Vec<u32> {
        fn walk(v: &serde_json::Value, out: &mut Vec<u64>) {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(n) = m.get("val").and_then(|n| n.as_u64()) {
                        out.push(n);
                    }
                    m.values().for_each(|v| walk(v, out));
                }
                serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
                _ => {}
            }
        }
        let mut vals = vec![0u64, 1, u64::MAX, 0x8000_0000, 0x4000_0000];
        walk(&profile(), &mut vals);
        let mut out: Vec<u32> = vals
            .iter()
            .flat_map(|&v| [v as u32, (v >> 32) as u32])
            .flat_map(|v| [v, v.wrapping_add(1), v.wrapping_sub(1)])
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    #[test]
    fn the_merged_program_answers_every_call_as_the_separate_filters_would() {
        let filters = Filters::compile().unwrap();
        let n = filters.parts.len();
        let all = merge(&filters.parts).unwrap();
        let vals = interesting_values();
        assert!(
            vals.len() > 20,
            "the profile's argument values were not found"
        );
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut pick = |len: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % len as u64) as usize
        };
        let mut answers = std::collections::BTreeSet::new();
        let mut checked = 0;
        for arch in [X86_64, 0x4000_0003 /* i386 */] {
            for nr in (0..480).chain([0x4000_0000, 0x4000_0001, 0x4000_0101, u32::MAX]) {
                for round in 0..48 {
                    let mut data = [0u32; 16];
                    data[0] = nr;
                    data[1] = arch;
                    for word in data.iter_mut().skip(4) {
                        *word = match round {
                            0 => 0,
                            1 => u32::MAX,
                            _ => vals[pick(vals.len())],
                        };
                    }
                    let want = kernel(&filters.parts, &data);
                    assert_eq!(run(&all, &data), want, "all: {data:x?}");
                    // What install() puts in place: the two merged programs.
                    let installed = [
                        ("inherited", filters.inherited.clone()),
                        ("last", filters.last.clone()),
                    ];
                    assert_eq!(kernel(&installed, &data), want, "installed: {data:x?}");
                    let last = kernel(&filters.parts[n - HELD_BACK..], &data);
                    assert_eq!(run(&filters.last, &data), last, "last: {data:x?}");
                    let want = kernel(&filters.parts[..n - HELD_BACK], &data);
                    assert_eq!(run(&filters.inherited, &data), want, "inherited: {data:x?}");
                    answers.insert(want);
                    checked += 1;
                }
            }
        }
        // Every kind of answer was among those compared: allow, kill, and each errno.
        for want in [
            libc::SECCOMP_RET_ALLOW,
            libc::SECCOMP_RET_KILL_PROCESS,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
            libc::SECCOMP_RET_ERRNO | libc::EINVAL as u32,
            libc::SECCOMP_RET_ERRNO | libc::EAFNOSUPPORT as u32,
            libc::SECCOMP_RET_ERRNO,
        ] {
            assert!(
                answers.contains(&want),
                "{want:#x} never came up in {checked}"
            );
        }
    }

    #[test]
    fn calls_every_filter_allows_outright_skip_the_merged_program_too() {
        let filters = Filters::compile().unwrap();
        let n = filters.parts.len();
        let mut outright = 0;
        for nr in 0..480 {
            let separate = filters.parts[..n - HELD_BACK]
                .iter()
                .all(|(_, p)| const_allow(p, nr, X86_64));
            assert_eq!(
                const_allow(&filters.inherited, nr, X86_64),
                separate,
                "nr {nr}"
            );
            outright += usize::from(separate);
            let separate = filters.parts[n - HELD_BACK..]
                .iter()
                .all(|(_, p)| const_allow(p, nr, X86_64));
            assert_eq!(
                const_allow(&filters.last, nr, X86_64),
                separate,
                "last: nr {nr}"
            );
        }
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_close,
            libc::SYS_futex,
        ] {
            assert!(
                const_allow(&filters.inherited, nr as u32, X86_64),
                "nr {nr}"
            );
        }
        assert!(outright > 100, "only {outright} calls allowed outright");
        assert!(!const_allow(
            &filters.inherited,
            libc::SYS_ptrace as u32,
            X86_64
        ));
    }

    #[test]
    fn the_merged_program_leaves_seccompiler_s_detours_out() {
        let filters = Filters::compile().unwrap();
        let n = filters.parts.len();
        let laid_end_to_end: usize = filters.parts[..n - 1].iter().map(|(_, p)| p.len()).sum();
        let merged = filters.inherited.len();
        eprintln!("merged: {merged} instructions, {laid_end_to_end} laid end to end");
        // Per allowed call a compare and a jump, not a compare, three jumps and two returns.
        assert!(
            merged * 2 < laid_end_to_end,
            "{merged} of {laid_end_to_end}"
        );
        // Nothing a run cannot reach, and no jump to a jump that it could have skipped.
        for (pc, i) in filters.inherited.iter().enumerate() {
            if i.code == JA {
                let to = &filters.inherited[pc + 1 + i.k as usize];
                assert!(to.code != JA && to.code != RET_K, "{pc}: {i:?}");
            }
        }
    }

    #[test]
    fn merging_refuses_what_it_cannot_reproduce() {
        let ins = |code, k| sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        };
        let check: Vec<sock_filter> = ARCH_CHECK
            .iter()
            .map(|&(code, jt, jf, k)| sock_filter { code, jt, jf, k })
            .collect();
        let with_check = |body: Vec<sock_filter>| [check.clone(), body].concat();
        let ok = with_check(vec![ins(LD_W_ABS, 0), ins(RET_K, libc::SECCOMP_RET_ALLOW)]);
        assert!(merge(&[("ok", ok.clone())]).is_ok());
        let two = with_check(vec![
            ins(LD_W_ABS, 0),
            ins(JEQ_K, 1),
            ins(RET_K, libc::SECCOMP_RET_KILL_PROCESS),
            ins(RET_K, libc::SECCOMP_RET_ERRNO | 1),
        ]);
        assert!(merge(&[("two", two)]).is_err());
        let computed = with_check(vec![ins(LD_W_ABS, 0), ins(0x16 /* RET A */, 0)]);
        assert!(merge(&[("computed", computed)]).is_err());
        let scratch = with_check(vec![ins(0x02 /* ST */, 0), ins(RET_K, 0)]);
        assert!(merge(&[("scratch", scratch)]).is_err());
        let unchecked = vec![ins(LD_W_ABS, 0), ins(RET_K, libc::SECCOMP_RET_ALLOW)];
        assert!(merge(&[("unchecked", unchecked)]).is_err());
        let long = vec![ins(LD_W_ABS, 0); MAX_INSNS];
        assert!(merge(&[("long", [check, long, ok].concat())]).is_err());
    }

    #[test]
    fn rules_without_a_reason_are_refused() {
        let json = r#"{"allow": {"comment": "x", "mismatch_action": "allow",
            "filter_action": "allow", "filter": [{"syscall": "read"}]}}"#;
        let err = strip_filter_comments(json).unwrap_err();
        assert!(err.contains("no reason"), "{err}");
    }

    #[test]
    fn unknown_syscall_names_are_an_error() {
        let json = strip_filter_comments(
            r#"{"allow": {"comment": "x", "mismatch_action": "allow",
            "filter_action": "allow", "filter": [{"syscall": "no_such_call", "comment": "y"}]}}"#,
        )
        .unwrap();
        assert!(seccompiler::compile_from_json(json.as_bytes(), TargetArch::x86_64).is_err());
    }

    #[test]
    fn the_embedded_programs_are_the_profile_s() {
        // build.rs compiled them; a stale or tampered build would differ from the JSON.
        let fresh = compile_parts(PROFILE_JSON).unwrap();
        let embedded = Filters::compile().unwrap();
        assert_eq!(embedded.parts, fresh);
        assert_eq!(embedded.encode(), COMPILED);
    }
}
