//! What a sandbox sends the host, as the host reads it: a program's response (result or
//! error, outputs, files), its captured output, and the frames of its channels (the tool
//! channel's calls, and frames read whole and in pieces, which must agree). Any bytes: an
//! answer or a refusal, never a panic, a hang or an allocation the input merely claims.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector % 4 {
        0 => {
            let _ = airlock_engine::fuzzing::response(rest, 1 << 20);
        }
        1 => {
            let len = airlock_engine::fuzzing::output(rest, selector & 0x80 != 0);
            assert!(len <= rest.len());
        }
        2 => {
            // A frame announcing more than the cap is refused before anything is allocated.
            let (calls, _breach) = airlock_engine::fuzzing::calls(rest, 4096);
            assert!(calls <= rest.len() / 4);
        }
        _ => {
            // A session reads its channel in whatever pieces the socket gives.
            let piece = usize::from(selector >> 2) + 1;
            let (frames, agree) = airlock_engine::fuzzing::frames(rest, 4096, piece);
            assert!(agree, "frames read in pieces of {piece} differ from frames read whole");
            assert!(frames <= rest.len() / 4);
        }
    }
});
