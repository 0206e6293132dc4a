//! Bad frees are detected and reported, and change nothing.

mod common;

use buddy::{AllocatorKind, FreeError};
use common::{assert_fully_coalesced, build, config};

#[test]
fn bad_frees_are_rejected_by_every_allocator() {
    for kind in AllocatorKind::ALL {
        let a = build(kind, 256, &config(2, Some(4)));
        let big = a.alloc_on(0, 3).unwrap();
        let small = a.alloc_on(1, 0).unwrap();

        assert_eq!(
            a.free_on(0, big + 1, 0),
            Err(FreeError::NotAllocationStart {
                frame: big + 1,
                head: big
            }),
            "{kind}"
        );
        assert_eq!(
            a.free_on(0, big, 2),
            Err(FreeError::WrongOrder {
                frame: big,
                given: 2,
                allocated: 3
            }),
            "{kind}"
        );
        assert_eq!(
            a.free_on(0, big + 1, 3),
            Err(FreeError::Misaligned {
                frame: big + 1,
                order: 3
            }),
            "{kind}"
        );
        assert_eq!(
            a.free_on(0, 4096, 0),
            Err(FreeError::OutOfPool {
                frame: 4096,
                frames: 256
            }),
            "{kind}"
        );
        assert_eq!(
            a.free_on(0, 0, 9),
            Err(FreeError::OrderTooLarge {
                order: 9,
                max_order: 4
            }),
            "{kind}"
        );

        a.free_on(1, small, 0).unwrap();
        assert_eq!(
            a.free_on(0, small, 0),
            Err(FreeError::NotAllocated { frame: small }),
            "{kind}: double free"
        );
        a.free_on(1, big, 3).unwrap();
        assert_fully_coalesced(&*a);
        // The error text is readable.
        let msg = FreeError::NotAllocated { frame: small }.to_string();
        assert!(msg.contains("double free"), "{msg}");
    }
}

/// A split allocation is freed piece by piece and coalesces back whole;
/// the pieces' frees are checked like any other, and the whole block can
/// no longer be freed at once.
#[test]
fn split_allocations_free_piece_by_piece() {
    for kind in AllocatorKind::ALL {
        let a = build(kind, 256, &config(2, Some(4)));
        let big = a.alloc_on(0, 4).unwrap();
        assert_eq!(
            a.split(big, 4, 5),
            Err(FreeError::OrderTooLarge {
                order: 5,
                max_order: 4
            }),
            "{kind}"
        );
        a.split(big, 4, 2).unwrap();
        assert_eq!(
            a.free_on(0, big, 4),
            Err(FreeError::WrongOrder {
                frame: big,
                given: 4,
                allocated: 2
            }),
            "{kind}"
        );
        assert_eq!(
            a.split(big, 4, 2),
            Err(FreeError::WrongOrder {
                frame: big,
                given: 4,
                allocated: 2
            }),
            "{kind}"
        );
        for piece in (big..big + 16).step_by(4) {
            a.free_on(1, piece, 2).unwrap();
        }
        assert_eq!(
            a.free_on(0, big + 4, 2),
            Err(FreeError::NotAllocated { frame: big + 4 }),
            "{kind}"
        );
        assert_fully_coalesced(&*a);
    }
}
