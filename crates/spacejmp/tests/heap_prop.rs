//! Property test of the segment heap: random alloc/free sequences never
//! hand out overlapping blocks, keep contents intact, and stay inside the
//! segment; live bytes return to zero when everything is freed.

mod common;

use common::Store;
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, TestRunner};
use spacejmp::{Access, SegOptions};

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64),
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..6000).prop_map(Op::Alloc),
        2 => any::<usize>().prop_map(Op::Free),
    ]
}

#[test]
fn heap_blocks_are_disjoint_and_preserved() {
    let st = Store::new("heapprop", 20);
    let jmp = st.open();
    let info = jmp.seg_alloc("h", 8 << 20, &SegOptions::default()).unwrap();
    jmp.vas_create("v", 0o660).unwrap();
    jmp.seg_attach("v", "h", Access::Write).unwrap();
    let vh = jmp.vas_attach("v", Default::default()).unwrap();
    let mut runner = TestRunner::new(PtConfig {
        cases: 24,
        ..PtConfig::default()
    });
    runner
        .run(&proptest::collection::vec(op(), 1..200), |ops| {
            let mut a = vh.switch().unwrap();
            let mut live: Vec<(u64, u64, u8)> = Vec::new();
            for (i, o) in ops.iter().enumerate() {
                match o {
                    Op::Alloc(sz) => {
                        let p = a.alloc_raw("h", *sz).unwrap();
                        prop_assert_eq!(p % 16, 0);
                        prop_assert!(p >= info.data_start() && p + sz <= info.end());
                        for &(q, qs, _) in &live {
                            prop_assert!(p + sz <= q || q + qs <= p, "overlap");
                        }
                        let fill = i as u8;
                        // SAFETY (test): a fresh block of `sz` writable bytes.
                        unsafe { std::ptr::write_bytes(p as *mut u8, fill, *sz as usize) };
                        live.push((p, *sz, fill));
                    }
                    Op::Free(k) if !live.is_empty() => {
                        let (p, sz, fill) = live.swap_remove(k % live.len());
                        // SAFETY (test): the block is live and `sz` bytes long.
                        let b = unsafe { std::slice::from_raw_parts(p as *const u8, sz as usize) };
                        prop_assert!(b.iter().all(|&x| x == fill), "contents changed");
                        a.free_raw(p).unwrap();
                    }
                    Op::Free(_) => {}
                }
            }
            for (p, _, _) in live.drain(..) {
                a.free_raw(p).unwrap();
            }
            prop_assert_eq!(a.heap_usage("h").unwrap().0, 0);
            Ok(())
        })
        .unwrap();
}
