//! A zygote's block of host ids: the template's outer init, root on the host, becomes the
//! block's first id and has a helper that stays root write the template's id maps (the whole
//! block: one id per child, each child's jail mapping its own).

use std::os::fd::OwnedFd;
use std::path::Path;

use nix::unistd::{self, Gid, Uid};

use crate::jail::{sys_err, InitError};
use crate::sys;

/// Host ids of zygotes: block `pid` (the template's outer init) of `ZYGOTE_IDS` ids each,
/// above the ids of cold sandboxes (`HOST_ID_BASE + pid`) and below 2^32 for any pid the
/// kernel can give (at most 2^22).
pub(crate) const ZYGOTE_ID_BASE: u32 = 0x8000_0000;
pub(crate) const ZYGOTE_IDS: u32 = 256;
/// The largest pid the kernel gives (`PID_MAX_LIMIT` on 64-bit).
pub(crate) const PID_MAX: u32 = 1 << 22;
// Every block ends below 2^32, whatever the pid.
const _: () = assert!(ZYGOTE_ID_BASE as u64 + (PID_MAX as u64 + 1) * ZYGOTE_IDS as u64 <= 1 << 32);

/// The first host id of the block of the template whose outer init is `pid`.
pub(crate) fn block_base(pid: i32) -> u32 {
    ZYGOTE_ID_BASE + (pid as u32) * ZYGOTE_IDS
}

/// Forked by a template's outer init while it is still root on the host, to write the id
/// maps of the template's user namespace once the outer init has made it.
pub(crate) struct IdWriter {
    go: OwnedFd,
    pid: i32,
}

impl IdWriter {
    pub(crate) fn fork() -> Result<IdWriter, InitError> {
        let (go_r, go_w) = unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys_err("pipe2"))?;
        let parent = unistd::getpid().as_raw();
        match sys::fork().map_err(sys_err("fork"))? {
            sys::ForkResult::Child => {
                drop(go_w);
                let mut byte = [0u8; 1];
                let ok = matches!(unistd::read(&go_r, &mut byte), Ok(1))
                    && write_block_maps(parent).is_ok();
                sys::exit_immediately(if ok { 0 } else { 1 })
            }
            sys::ForkResult::Parent { child } => {
                drop(go_r);
                Ok(IdWriter {
                    go: go_w,
                    pid: child.as_raw(),
                })
            }
        }
    }

    /// Has the block's maps written into the outer init's new user namespace, and waits for
    /// them.
    pub(crate) fn write_maps(self) -> Result<(), InitError> {
        unistd::write(&self.go, b"g").map_err(sys_err("write"))?;
        match sys::wait_child(self.pid) {
            Ok((_, sys::Waited::Exited(0), _)) => Ok(()),
            _ => Err(InitError::Sys {
                call: "writing the zygote's id maps",
                source: std::io::Error::other("the helper failed"),
            }),
        }
    }
}

/// The template's ids: 0..ZYGOTE_IDS inside, its block outside; `setgroups` denied.
fn write_block_maps(pid: i32) -> std::io::Result<()> {
    let proc = Path::new("/proc").join(pid.to_string());
    let map = block_map(pid);
    std::fs::write(proc.join("uid_map"), &map)?;
    std::fs::write(proc.join("setgroups"), "deny")?;
    std::fs::write(proc.join("gid_map"), &map)
}

/// A `uid_map` (or `gid_map`) line: the block of the template whose outer init is `pid`.
fn block_map(pid: i32) -> String {
    format!("0 {} {ZYGOTE_IDS}\n", block_base(pid))
}

/// As root on the host, become the first id of this template's block (its root inside).
pub(crate) fn drop_host_root_to_block() -> Result<(), InitError> {
    let id = block_base(unistd::getpid().as_raw());
    unistd::setgroups(&[]).map_err(sys_err("setgroups"))?;
    let gid = Gid::from_raw(id);
    unistd::setresgid(gid, gid, gid).map_err(sys_err("setresgid"))?;
    let uid = Uid::from_raw(id);
    unistd::setresuid(uid, uid, uid).map_err(sys_err("setresuid"))?;
    nix::sys::prctl::set_dumpable(true).map_err(sys_err("prctl(PR_SET_DUMPABLE)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_template_maps_a_block_of_its_own_from_0() {
        assert_eq!(
            block_map(3),
            format!("0 {} 256\n", 0x8000_0000u32 + 3 * 256)
        );
        // Consecutive pids, consecutive blocks: no id in two.
        assert_eq!(block_base(101) - block_base(100), ZYGOTE_IDS);
        assert_eq!(block_base(PID_MAX as i32), 0xC000_0000);
    }
}
