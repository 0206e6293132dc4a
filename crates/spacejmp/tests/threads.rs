//! Threads of one process contending for the same lockable segment through
//! one attached VAS: writers exclude each other and readers; readers share.

mod common;

use common::Store;
use spacejmp::{Access, SegOptions};
use std::sync::atomic::{AtomicU32, Ordering};

#[test]
fn threads_serialize_on_the_segment_lock() {
    let st = Store::new("threads", 30);
    let jmp = st.open();
    jmp.seg_alloc("s", 1 << 20, &SegOptions::default()).unwrap();
    jmp.vas_create("w", 0o660).unwrap();
    jmp.seg_attach("w", "s", Access::Write).unwrap();
    jmp.vas_create("r", 0o660).unwrap();
    jmp.seg_attach("r", "s", Access::Read).unwrap();
    let hw = jmp.vas_attach("w", Default::default()).unwrap();
    let hr = jmp.vas_attach("r", Default::default()).unwrap();
    let readers_inside = AtomicU32::new(0);
    let max_readers = AtomicU32::new(0);
    let n = 200u64;
    std::thread::scope(|sc| {
        for _ in 0..2 {
            sc.spawn(|| {
                for _ in 0..n {
                    let mut a = hw.switch().unwrap();
                    assert_eq!(readers_inside.load(Ordering::SeqCst), 0);
                    let b = a.bytes_mut("s").unwrap();
                    let x = u64::from_le_bytes(b[..8].try_into().unwrap());
                    std::thread::yield_now();
                    b[..8].copy_from_slice(&(x + 1).to_le_bytes());
                }
            });
        }
        for _ in 0..2 {
            sc.spawn(|| {
                for _ in 0..n {
                    let a = hr.switch().unwrap();
                    let k = readers_inside.fetch_add(1, Ordering::SeqCst) + 1;
                    max_readers.fetch_max(k, Ordering::SeqCst);
                    let _ = a.bytes("s").unwrap()[0];
                    std::thread::yield_now();
                    readers_inside.fetch_sub(1, Ordering::SeqCst);
                }
            });
        }
    });
    let a = hr.switch().unwrap();
    assert_eq!(
        u64::from_le_bytes(a.bytes("s").unwrap()[..8].try_into().unwrap()),
        2 * n
    );
    assert_eq!(jmp.stats().snapshot().remaps, 0);
}
