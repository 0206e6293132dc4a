//! Property tests of both parsers: no input makes them panic, and the
//! requests they produce do not depend on how the input is split into
//! reads (the connection feeds them whatever each read returned).

use proptest::prelude::*;
use server::memcache::{self, McParsed};
use server::resp::{Limits, Parsed, Parser};

const LIMITS: Limits = Limits {
    max_multibulk: 16,
    max_bulk: 64,
    max_inline: 80,
    unauthenticated: false,
};

/// What a parser run produced: the requests, then how it ended.
type Outcome = (Vec<String>, String);

fn resp_whole(input: &[u8]) -> Outcome {
    resp_split(input, &[input.len().max(1)])
}

/// One parse of the unparsed bytes: a request (as text, and the bytes it
/// used), more input needed (the bytes wanted in all), or the end.
enum Step {
    Request(String, usize),
    Incomplete(usize),
    End(String),
}

/// Feed `input` in chunks of the given sizes, like a connection would,
/// parsing everything complete after each.
fn split(input: &[u8], sizes: &[usize], mut parse: impl FnMut(&[u8]) -> Step) -> Outcome {
    let mut buf: Vec<u8> = Vec::new();
    let mut start = 0;
    let mut reqs = Vec::new();
    let mut fed = 0;
    let mut sizes = sizes.iter().cycle();
    loop {
        loop {
            match parse(&buf[start..]) {
                Step::Request(r, used) => {
                    assert!(used > 0 && start + used <= buf.len());
                    reqs.push(r);
                    start += used;
                }
                Step::Incomplete(n) => {
                    assert!(n > buf.len() - start, "incomplete must ask for more");
                    break;
                }
                Step::End(e) => return (reqs, e),
            }
        }
        if fed == input.len() {
            return (reqs, "incomplete".into());
        }
        let n = (*sizes.next().unwrap()).max(1).min(input.len() - fed);
        buf.extend_from_slice(&input[fed..fed + n]);
        fed += n;
    }
}

fn resp_split(input: &[u8], sizes: &[usize]) -> Outcome {
    let mut p = Parser::new();
    split(input, sizes, |b| match p.parse(b, &LIMITS) {
        Ok(Parsed::Request(r)) => {
            let args: Vec<Vec<u8>> = r.slices(b).iter().map(|s| s.to_vec()).collect();
            Step::Request(format!("{args:?}"), r.consumed)
        }
        Ok(Parsed::Incomplete(n)) => Step::Incomplete(n),
        Err(e) => Step::End(format!("error {e}")),
    })
}

fn mc_split(input: &[u8], sizes: &[usize]) -> Outcome {
    split(input, sizes, |b| match memcache::parse(b, 64) {
        Ok(McParsed::Command(c, used)) => Step::Request(format!("{c:?}"), used),
        Ok(McParsed::Incomplete(n)) => Step::Incomplete(n),
        Err(e) => Step::End(format!("fatal {}", e.0)),
    })
}

/// Inputs that look like protocol more often than random bytes do.
fn pieces() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"*2\r\n".to_vec()),
        Just(b"*1\r\n".to_vec()),
        Just(b"*-1\r\n".to_vec()),
        Just(b"*99\r\n".to_vec()),
        Just(b"$3\r\n".to_vec()),
        Just(b"$-1\r\n".to_vec()),
        Just(b"$100\r\n".to_vec()),
        Just(b"GET\r\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"PING\r\n".to_vec()),
        Just(b"set \"a b\" 'c'\r\n".to_vec()),
        Just(b"\"\\x4".to_vec()),
        Just(b"set k 1 0 3\r\nabc\r\n".to_vec()),
        Just(b"get a b c\r\n".to_vec()),
        Just(b"cas k 0 0 2 99 noreply\r\nxy\r\n".to_vec()),
        Just(b"incr k 18446744073709551616\r\n".to_vec()),
        Just(b"gat -5 k\r\n".to_vec()),
        Just(b"set k 0 0 -1\r\n".to_vec()),
        Just(b"set k 0 0 65\r\n".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..8),
        proptest::collection::vec(prop_oneof![Just(b'a'), Just(b' '), Just(b'$')], 0..100),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn resp_split_invariant(input in pieces(), sizes in proptest::collection::vec(1usize..40, 1..8)) {
        prop_assert_eq!(resp_whole(&input), resp_split(&input, &sizes));
    }

    #[test]
    fn resp_random_bytes(input in proptest::collection::vec(any::<u8>(), 0..600), sizes in proptest::collection::vec(1usize..64, 1..6)) {
        prop_assert_eq!(resp_whole(&input), resp_split(&input, &sizes));
    }

    #[test]
    fn memcached_split_invariant(input in pieces(), sizes in proptest::collection::vec(1usize..40, 1..8)) {
        prop_assert_eq!(mc_split(&input, &[input.len().max(1)]), mc_split(&input, &sizes));
    }

    #[test]
    fn memcached_random_bytes(input in proptest::collection::vec(any::<u8>(), 0..3000), sizes in proptest::collection::vec(1usize..700, 1..6)) {
        prop_assert_eq!(mc_split(&input, &[input.len().max(1)]), mc_split(&input, &sizes));
    }

    #[test]
    fn truncation_never_completes_more(input in pieces(), cut in 0usize..200) {
        let cut = cut.min(input.len());
        let (full, _) = resp_whole(&input);
        let (part, _) = resp_whole(&input[..cut]);
        prop_assert!(part.len() <= full.len());
        prop_assert_eq!(&full[..part.len()], &part[..]);
    }
}
