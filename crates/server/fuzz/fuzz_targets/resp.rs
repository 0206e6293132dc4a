//! Fuzz the RESP request parser: it must never panic, every `consumed` and
//! range must lie inside the buffer, and feeding the input in two pieces
//! (split where the first byte says) must give the same requests and the
//! same ending as feeding it whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use server::resp::{Limits, Parsed, Parser};

const LIMITS: Limits = Limits {
    max_multibulk: 64,
    max_bulk: 4096,
    max_inline: 4096,
};

fn run(input: &[u8], split: usize) -> (Vec<Vec<Vec<u8>>>, bool) {
    let mut p = Parser::new();
    let mut buf = Vec::new();
    let mut start = 0;
    let mut reqs = Vec::new();
    for piece in [&input[..split], &input[split..]] {
        buf.extend_from_slice(piece);
        loop {
            match p.parse(&buf[start..], &LIMITS) {
                Ok(Parsed::Request(r)) => {
                    assert!(r.consumed > 0 && start + r.consumed <= buf.len());
                    reqs.push(r.slices(&buf[start..]).iter().map(|s| s.to_vec()).collect());
                    start += r.consumed;
                }
                Ok(Parsed::Incomplete(n)) => {
                    assert!(n > buf.len() - start);
                    break;
                }
                Err(_) => return (reqs, true),
            }
        }
    }
    (reqs, false)
}

fuzz_target!(|data: &[u8]| {
    let split = match data.first() {
        Some(&b) if !data.is_empty() => b as usize % data.len(),
        _ => 0,
    };
    assert_eq!(run(data, data.len()), run(data, split));
});
