//! Fuzz the memcached text parser: no panics, consumed bytes inside the
//! buffer, and the same commands whether the input arrives whole or split.
#![no_main]

use libfuzzer_sys::fuzz_target;
use server::memcache::{parse, McParsed};

fn run(input: &[u8], split: usize) -> (Vec<String>, bool) {
    let mut buf = Vec::new();
    let mut start = 0;
    let mut cmds = Vec::new();
    for piece in [&input[..split], &input[split..]] {
        buf.extend_from_slice(piece);
        loop {
            match parse(&buf[start..], 1024) {
                Ok(McParsed::Command(c, used)) => {
                    assert!(used > 0 && start + used <= buf.len());
                    cmds.push(format!("{c:?}"));
                    start += used;
                }
                Ok(McParsed::Incomplete(n)) => {
                    assert!(n > buf.len() - start);
                    break;
                }
                Err(_) => return (cmds, true),
            }
        }
    }
    (cmds, false)
}

fuzz_target!(|data: &[u8]| {
    let split = match data.first() {
        Some(&b) if !data.is_empty() => b as usize % data.len(),
        _ => 0,
    };
    assert_eq!(run(data, data.len()), run(data, split));
});
