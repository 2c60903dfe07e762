//! Entry points for the fuzz targets (`fuzz/`, cargo fuzz): the host's parsing of what a
//! sandbox sends it. Not an API.

use crate::channel::{self, Frame};
use crate::{pump, tools, verdict};

/// A program's response (its result or error, outputs and files), as the host reads it
/// from a one-shot's or a session's channel: whether it was accepted.
pub fn response(bytes: &[u8], limit: u64) -> bool {
    verdict::parse_response(bytes, false, limit).is_ok()
}

/// Captured output as the result holds it: its length in bytes.
pub fn output(bytes: &[u8], truncated: bool) -> usize {
    pump::decode_output(bytes.to_vec(), truncated).len()
}

/// Reads `bytes` as a tool channel's frames, each at most `cap` bytes, as the tool broker
/// does: the calls parsed before the end or the first breach of the protocol, and whether
/// there was one.
pub fn calls(bytes: &[u8], cap: u64) -> (usize, bool) {
    tools::read_calls(bytes, cap)
}

/// `bytes` read as a channel's frames of at most `cap` bytes, whole (as the tool broker
/// reads) and in pieces of `piece` bytes (as a session reads): the frames read before the
/// end or the first broken one, and whether the two readers agree.
pub fn frames(bytes: &[u8], cap: u64, piece: usize) -> (usize, bool) {
    let (whole, pieces) = channel::read_both(bytes, cap, piece);
    let data = whole.iter().filter(|f| matches!(f, Frame::Data(_))).count();
    (data, whole == pieces)
}
