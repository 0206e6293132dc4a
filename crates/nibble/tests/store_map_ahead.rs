//! Mapping memory in ahead of the log (`Config::map_ahead`) racing the
//! releases that give it back: writers in bursts separated by quiet gaps
//! longer than a very short decay time, so that every gap ends in an idle
//! release (every free block back to the OS and the buddy allocator), the
//! first append of every burst asks for a region mapped ahead, and the
//! decay-time release runs beside the writers. A block dropped while it
//! held an object would read back as zeros: every value encodes its key
//! and version, and every key is checked against a model during the run
//! and at the end. One test in its own binary (process).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nibble::{Config, Mode, Store};

const WRITERS: u32 = 3;
const KEYS_PER_WRITER: u32 = 400;

fn value(key: u32, version: u32) -> Vec<u8> {
    let len = 200 + ((key * 7 + version * 13) % 1800) as usize;
    let seed = key.wrapping_mul(2_654_435_761) ^ version.wrapping_mul(40_503);
    (0..len)
        .map(|i| (seed.wrapping_add(i as u32 * 31) >> 3) as u8 | 1)
        .collect()
}

fn run(mode: Mode) {
    let mut cfg = Config::new(32 << 20);
    cfg.mode = mode;
    cfg.segment_bytes = Some(1 << 20);
    cfg.decay_ms = 10;
    assert!(cfg.map_ahead, "on by default");
    let s = Store::new(cfg).unwrap();
    let deadline = Instant::now() + Duration::from_millis(1500);
    std::thread::scope(|scope| {
        for w in 0..WRITERS {
            let s = &s;
            scope.spawn(move || {
                let mut model: HashMap<u32, u32> = HashMap::new();
                let mut rng = 0x9E37_79B9u32.wrapping_mul(w + 1);
                let mut next = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 17;
                    rng ^= rng << 5;
                    rng
                };
                let mut round = 0u32;
                while Instant::now() < deadline {
                    round += 1;
                    for _ in 0..2_000 {
                        let k = w * KEYS_PER_WRITER + next() % KEYS_PER_WRITER;
                        let key = format!("key:{k}");
                        match next() % 10 {
                            0 => {
                                s.delete(key.as_bytes()).unwrap();
                                model.remove(&k);
                            }
                            1..=3 => {
                                let got = s.get(key.as_bytes()).unwrap();
                                let want = model.get(&k).map(|&v| value(k, v));
                                assert_eq!(got, want, "{mode:?}: key {k} in round {round}");
                            }
                            _ => {
                                s.put(key.as_bytes(), &value(k, round)).unwrap();
                                model.insert(k, round);
                            }
                        }
                    }
                    // Quiet for longer than the decay time: the workers
                    // find the store idle and release every free block.
                    std::thread::sleep(Duration::from_millis(15 + (next() % 20) as u64));
                }
                for k in w * KEYS_PER_WRITER..(w + 1) * KEYS_PER_WRITER {
                    let got = s.get(format!("key:{k}").as_bytes()).unwrap();
                    assert_eq!(
                        got,
                        model.get(&k).map(|&v| value(k, v)),
                        "{mode:?}: key {k}"
                    );
                }
            });
        }
    });
    // On a loaded machine the gaps may all have passed between two
    // worker ticks; the quiet after the writers cannot.
    let until = Instant::now() + Duration::from_secs(5);
    while s.stats().blocks_released == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = s.stats();
    assert!(
        st.blocks_mapped_ahead > 0,
        "{mode:?}: nothing mapped ahead: {st:?}"
    );
    assert!(st.blocks_released > 0, "{mode:?}: nothing released: {st:?}");
}

#[test]
fn regions_mapped_ahead_and_released_lose_no_object() {
    run(Mode::Nibble);
    run(Mode::Nibble2);
}
