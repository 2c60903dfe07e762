//! The network namespaces of a template's jails: made by the template's init in its own user
//! namespace, lent to one jail at a time, and lent again only when the jail that had one left
//! it exactly as it was made.
//!
//! Making a network namespace is the dearest step of a jail (its loopback device, sysctl
//! tables, conntrack and the rest, 0.3 ms of the template's time here, and as much again for a
//! kernel worker to free it), and nearly every sandbox leaves its own untouched. So when a
//! jail's init has been reaped (the kernel has then ended every process of its PID
//! namespace), the template enters the namespace and reads what anything inside could see
//! of it or leave in it: the sockets in use (per protocol, and every unix socket), and the
//! protocol counters. Equal to what they were when it was made, it goes to the next jail;
//! otherwise it is closed, and the kernel frees it. A socket that outlives its sandbox (held
//! in flight by another process) is seen in use; a sandbox that tried to send leaves a
//! counter moved. Nothing else in it can change: its loopback stays down, and it belongs to
//! the template's user namespace, in which no jail holds a capability (a jail cannot bring a
//! device up, write a sysctl or add a rule, as it could in one of its own).

use std::fs;
use std::io;
use std::os::fd::OwnedFd;

use nix::sched::{setns, unshare, CloneFlags};

/// At most this many namespaces wait for a jail; more are freed.
const KEPT: usize = 32;

/// The files of `/proc/thread-self/net` whose every byte is the namespace's own: its
/// protocol counters (`snmp6` only where IPv6 is built in).
const COUNTERS: [&str; 3] = ["snmp", "netstat", "snmp6"];
/// The socket counts, with fields of the whole machine among them (TCP's `alloc` and `mem`):
/// only the namespace's own are compared ([`OWN_FIELDS`]).
const SOCKETS: [&str; 2] = ["sockstat", "sockstat6"];
/// The namespace's own fields of `sockstat`/`sockstat6`: sockets in use (`used`, `inuse`),
/// in TIME-WAIT (`tw`), fragments held (`memory`).
const OWN_FIELDS: [&str; 4] = ["used", "inuse", "tw", "memory"];

/// What a jail could see of its network namespace, or leave in it.
#[derive(Debug, PartialEq)]
pub(super) struct Seen {
    counters: Vec<Option<String>>,
    sockets: Vec<(String, String, u64)>,
    unix_sockets: usize,
}

impl Seen {
    /// Read in the namespace the calling thread is in.
    pub(super) fn here() -> io::Result<Seen> {
        let read = |name: &str| match fs::read_to_string(format!("/proc/thread-self/net/{name}")) {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        };
        let counters = COUNTERS
            .iter()
            .map(|name| read(name))
            .collect::<io::Result<_>>()?;
        let mut sockets = Vec::new();
        for name in SOCKETS {
            sockets.extend(own_fields(&read(name)?.unwrap_or_default()));
        }
        // Its header, then a line per socket.
        let unix = read("unix")?.unwrap_or_default();
        Ok(Seen {
            counters,
            sockets,
            unix_sockets: unix.lines().count().saturating_sub(1),
        })
    }
}

/// `PROTOCOL: name value name value ...` lines: each (protocol, name, value) whose name is one
/// of [`OWN_FIELDS`].
fn own_fields(text: &str) -> Vec<(String, String, u64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((protocol, fields)) = line.split_once(':') else {
            continue;
        };
        let words: Vec<&str> = fields.split_whitespace().collect();
        for pair in words.chunks(2) {
            if let [name, value] = pair {
                if OWN_FIELDS.contains(name) {
                    // A value that is not a number is kept as one that never equals a fresh
                    // namespace's.
                    let value = value.parse().unwrap_or(u64::MAX);
                    out.push((protocol.to_owned(), (*name).to_owned(), value));
                }
            }
        }
    }
    out
}

/// A network namespace of the template's, with what it showed when it was made.
#[derive(Debug)]
pub(super) struct Net {
    fd: OwnedFd,
    made: Seen,
}

/// The template's namespaces: its own, to come back to, and those that wait for a jail.
pub(super) struct Nets {
    own: OwnedFd,
    free: Vec<Net>,
}

impl Nets {
    /// The calling thread's namespace is the template's own.
    pub(super) fn new() -> io::Result<Nets> {
        Ok(Nets {
            own: open_current()?,
            free: Vec::new(),
        })
    }

    /// Enters a namespace for the next jail, one that waits or a new one: a process cloned
    /// now without `CLONE_NEWNET` is in it. [`Nets::leave`] comes back.
    pub(super) fn enter(&mut self) -> io::Result<Net> {
        if let Some(net) = self.free.pop() {
            match setns(&net.fd, CloneFlags::CLONE_NEWNET) {
                Ok(()) => return Ok(net),
                // Not expected of one we made; a new one will do.
                Err(_) => drop(net),
            }
        }
        unshare(CloneFlags::CLONE_NEWNET)?;
        let made = (|| {
            Ok(Net {
                fd: open_current()?,
                made: Seen::here()?,
            })
        })();
        if made.is_err() {
            let _ = self.leave();
        }
        made
    }

    /// Back in the template's own namespace.
    pub(super) fn leave(&self) -> io::Result<()> {
        setns(&self.own, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
    }

    /// The jail that had `net` is gone (its init reaped): kept for the next one if it is as it
    /// was made, freed otherwise (also when it cannot be read, or enough wait already).
    /// Whether it was kept.
    pub(super) fn give_back(&mut self, net: Net) -> bool {
        if self.free.len() >= KEPT || setns(&net.fd, CloneFlags::CLONE_NEWNET).is_err() {
            return false;
        }
        let seen = Seen::here();
        if self.leave().is_err() {
            // Nowhere else to be: the template stays where it is, and makes no more
            // namespaces of its own from it than from its own (each jail's is entered first).
            return false;
        }
        let unchanged = matches!(seen, Ok(seen) if seen == net.made);
        if unchanged {
            self.free.push(net);
        }
        unchanged
    }
}

fn open_current() -> io::Result<OwnedFd> {
    Ok(fs::File::open("/proc/thread-self/ns/net")?.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_namespace_s_own_socket_fields_are_compared() {
        let sockstat = "sockets: used 3\nTCP: inuse 1 orphan 0 tw 2 alloc 9 mem 52\n\
                        UDP: inuse 0 mem 4\nFRAG: inuse 0 memory 0\n";
        let fields = own_fields(sockstat);
        let names: Vec<String> = fields
            .iter()
            .map(|(p, n, v)| format!("{p}.{n}={v}"))
            .collect();
        assert_eq!(
            names,
            [
                "sockets.used=3",
                "TCP.inuse=1",
                "TCP.tw=2",
                "UDP.inuse=0",
                "FRAG.inuse=0",
                "FRAG.memory=0"
            ]
        );
        // The machine's fields may move between two readings; the namespace's may not.
        let later = sockstat.replace("alloc 9 mem 52", "alloc 11 mem 60");
        assert_eq!(own_fields(&later), fields);
        let busier = sockstat.replace("tw 2", "tw 3");
        assert_ne!(own_fields(&busier), fields);
        assert_eq!(
            own_fields("TCP: inuse x")[0],
            ("TCP".to_owned(), "inuse".to_owned(), u64::MAX)
        );
    }

    /// In a network namespace of a thread's own (root only): a fresh one reads the same twice;
    /// a socket open, a send that found no route (a counter moved), a unix pair: each is seen,
    /// and the socket is no longer in use once closed, while the counter stays moved.
    #[test]
    fn what_a_sandbox_leaves_in_a_network_namespace_is_seen() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: making a network namespace needs root");
            return;
        }
        std::thread::spawn(|| {
            unshare(CloneFlags::CLONE_NEWNET).unwrap();
            let made = Seen::here().unwrap();
            assert_eq!(Seen::here().unwrap(), made);
            assert!(made.counters[0].is_some(), "no snmp: {made:?}");

            let udp = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            let open = Seen::here().unwrap();
            assert_ne!(open.sockets, made.sockets, "an open socket is not seen");
            assert_eq!(open.counters, made.counters);
            let sent = udp.send_to(b"x", "127.0.0.1:9");
            assert!(
                sent.is_err(),
                "loopback is down in a new namespace: {sent:?}"
            );
            drop(udp);
            let after = Seen::here().unwrap();
            assert_eq!(
                after.sockets, made.sockets,
                "a closed socket is still in use"
            );
            assert_ne!(
                after.counters, made.counters,
                "a send without a route moved no counter"
            );

            let pair = std::os::unix::net::UnixStream::pair().unwrap();
            assert_eq!(Seen::here().unwrap().unix_sockets, made.unix_sockets + 2);
            drop(pair);
            assert_eq!(Seen::here().unwrap().unix_sockets, made.unix_sockets);
        })
        .join()
        .unwrap();
    }
}
