//! The frames of a channel between the host and a sandbox: a 4-byte little-endian length, then
//! that many bytes (marshal from the host, JSON from the sandbox). A session's channel
//! (descriptor 3) and code mode's tool channel (descriptor 4) carry them, written by [`frame`]
//! and read by [`read`] (a blocking channel: the tool broker's) or an [`Assembler`] (bytes as
//! a non-blocking channel gives them: a session's); the runner has one reader of its own,
//! `read_frame`. A reader is given the most a frame may hold and refuses a longer one from
//! its length alone, before anything of it is allocated.

use std::io::Read;

/// The length before each frame.
const HEAD: usize = 4;

/// What a reader got from a channel.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// One whole frame's payload.
    Data(Vec<u8>),
    /// The channel ended, or failed, before the next frame's length was whole.
    End,
    /// The channel broke the protocol.
    Broken(Broken),
}

/// How a frame broke the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Broken {
    /// Its length says more than the reader takes.
    #[error("a frame of {len} bytes, over the limit of {cap} bytes")]
    TooLarge { len: u64, cap: u64 },
    /// The channel ended, or failed, inside it.
    #[error("the channel closed in the middle of a frame")]
    Cut,
}

/// A payload longer than a frame's length can say.
#[derive(Debug, thiserror::Error)]
#[error("a frame of {0} bytes is over the 4 GiB a frame can hold")]
pub struct Oversized(pub usize);

/// `payload` as one frame: its length, then itself.
pub fn frame(payload: &[u8]) -> Result<Vec<u8>, Oversized> {
    let len = u32::try_from(payload.len()).map_err(|_| Oversized(payload.len()))?;
    let mut framed = Vec::with_capacity(HEAD + payload.len());
    framed.extend_from_slice(&len.to_le_bytes());
    framed.extend_from_slice(payload);
    Ok(framed)
}

/// The payload's length a frame's head announces, when it is at most `cap`.
fn announced(head: [u8; HEAD], cap: u64) -> Result<usize, Broken> {
    let len = u64::from(u32::from_le_bytes(head));
    if len > cap {
        return Err(Broken::TooLarge { len, cap });
    }
    Ok(len as usize)
}

/// The next frame of at most `cap` bytes from a blocking reader.
pub fn read(reader: &mut impl Read, cap: u64) -> Frame {
    let mut head = [0u8; HEAD];
    if reader.read_exact(&mut head).is_err() {
        return Frame::End;
    }
    let len = match announced(head, cap) {
        Ok(len) => len,
        Err(broken) => return Frame::Broken(broken),
    };
    let mut payload = vec![0u8; len];
    match reader.read_exact(&mut payload) {
        Ok(()) => Frame::Data(payload),
        Err(_) => Frame::Broken(Broken::Cut),
    }
}

/// Frames of at most `cap` bytes put together from the pieces a non-blocking channel gives.
/// Asked for a frame after each piece, it holds at most one frame and the piece that ended it.
#[derive(Debug)]
pub struct Assembler {
    cap: u64,
    bytes: Vec<u8>,
}

impl Assembler {
    pub fn new(cap: u64) -> Self {
        Assembler {
            cap,
            bytes: Vec::new(),
        }
    }

    /// Takes what was read from the channel.
    pub fn push(&mut self, piece: &[u8]) {
        self.bytes.extend_from_slice(piece);
    }

    /// The next frame once it is whole, or [`Broken::TooLarge`] as soon as its length is in;
    /// [`None`] while more is needed.
    pub fn frame(&mut self) -> Option<Frame> {
        let head: [u8; HEAD] = self.bytes.get(..HEAD)?.try_into().ok()?;
        let len = match announced(head, self.cap) {
            Ok(len) => len,
            Err(broken) => return Some(Frame::Broken(broken)),
        };
        if self.bytes.len() < HEAD + len {
            return None;
        }
        let rest = self.bytes.split_off(HEAD + len);
        let mut payload = std::mem::replace(&mut self.bytes, rest);
        payload.drain(..HEAD);
        Some(Frame::Data(payload))
    }

    /// What the channel's end gives: the frame it completed, [`Frame::End`] between frames,
    /// [`Broken::Cut`] inside one (as [`read`] says of the same bytes).
    pub fn end(&mut self) -> Frame {
        match self.frame() {
            Some(frame) => frame,
            None if self.bytes.len() < HEAD => Frame::End,
            None => Frame::Broken(Broken::Cut),
        }
    }
}

/// `bytes` read as a channel's frames, whole by [`read`] and in pieces of `piece` bytes by an
/// [`Assembler`]: what each read, up to the end or the first broken frame (for the fuzz
/// target, which wants the two the same).
pub(crate) fn read_both(bytes: &[u8], cap: u64, piece: usize) -> (Vec<Frame>, Vec<Frame>) {
    let mut whole = Vec::new();
    let mut reader = bytes;
    loop {
        let frame = read(&mut reader, cap);
        let last = !matches!(frame, Frame::Data(_));
        whole.push(frame);
        if last {
            break;
        }
    }
    let mut pieces = Vec::new();
    let mut assembler = Assembler::new(cap);
    for chunk in bytes.chunks(piece.max(1)) {
        assembler.push(chunk);
        while let Some(frame) = assembler.frame() {
            let last = !matches!(frame, Frame::Data(_));
            pieces.push(frame);
            if last {
                return (whole, pieces);
            }
        }
    }
    loop {
        let frame = assembler.end();
        let last = !matches!(frame, Frame::Data(_));
        pieces.push(frame);
        if last {
            return (whole, pieces);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_its_length_then_its_payload() {
        assert_eq!(frame(b"{}").unwrap(), b"\x02\x00\x00\x00{}");
        assert_eq!(frame(b"").unwrap(), b"\x00\x00\x00\x00");
        let mut bytes = [frame(b"one").unwrap(), frame(b"").unwrap()].concat();
        bytes.extend_from_slice(b"\x07\x00");
        let mut reader = &bytes[..];
        assert_eq!(read(&mut reader, 3), Frame::Data(b"one".to_vec()));
        assert_eq!(read(&mut reader, 3), Frame::Data(Vec::new()));
        // A length cut short ends the channel; a payload cut short breaks it.
        assert_eq!(read(&mut reader, 3), Frame::End);
        assert_eq!(
            read(&mut &b"\x05\x00\x00\x00{}"[..], 10),
            Frame::Broken(Broken::Cut)
        );
    }

    #[test]
    fn a_frame_over_the_cap_is_refused_from_its_length_alone() {
        let mut big = &b"\xff\xff\xff\x7f"[..];
        assert_eq!(
            read(&mut big, 10),
            Frame::Broken(Broken::TooLarge {
                len: 0x7fff_ffff,
                cap: 10
            })
        );
        let mut assembler = Assembler::new(10);
        assembler.push(b"\x0b\x00\x00");
        assert_eq!(assembler.frame(), None);
        assembler.push(b"\x00");
        assert_eq!(
            assembler.frame(),
            Some(Frame::Broken(Broken::TooLarge { len: 11, cap: 10 }))
        );
    }

    #[test]
    fn pieces_make_the_frames_a_whole_read_makes() {
        let stream = [
            frame(b"first").unwrap(),
            frame(b"").unwrap(),
            frame(&[7; 40]).unwrap(),
        ]
        .concat();
        let cases: Vec<Vec<u8>> = vec![
            stream.clone(),
            stream[..stream.len() - 1].to_vec(),
            [&stream[..], b"\x01\x00"].concat(),
            [&stream[..], b"\xff\x00\x00\x00"].concat(),
            Vec::new(),
        ];
        for bytes in &cases {
            for piece in [1, 2, 3, 5, 64, 1000] {
                let (whole, pieces) = read_both(bytes, 40, piece);
                assert_eq!(whole, pieces, "{bytes:?} in pieces of {piece}");
            }
        }
        let (frames, _) = read_both(&stream, 40, 1);
        assert_eq!(
            frames,
            [
                Frame::Data(b"first".to_vec()),
                Frame::Data(Vec::new()),
                Frame::Data(vec![7; 40]),
                Frame::End
            ]
        );
    }
}
