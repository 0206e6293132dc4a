//! DUMP and RESTORE against redis-server: payloads compared byte for byte
//! (LZF-compressed strings and listpacks included; a hash in Redis's hash
//! table encoding is left out, its field order being the dict's), and
//! moved both ways (a payload from each server restored on the other must
//! give the same value).

use super::harness::{step, Pair, Step};
use crate::common::V;

fn args(v: &[&[u8]]) -> Step {
    Step {
        args: v.iter().map(|a| a.to_vec()).collect(),
        cmp: super::harness::Cmp::Exact,
    }
}

#[test]
fn dump_restore_match_redis() {
    let Some(mut p) = Pair::start("dump_restore_match_redis") else {
        return;
    };
    // Pseudo-random bytes: nothing for LZF to compress, so Redis writes
    // them raw too and the payloads can be compared.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let long_random: Vec<u8> = (0..300)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    let setup: Vec<Step> = vec![
        step("SET s1 hello"),
        step("SET s2 \"\""),
        step("SET i1 7"),
        step("SET i2 -200"),
        step("SET i3 40000"),
        step("SET i4 -2147483648"),
        step("SET i5 2147483648"),
        step("SET i6 9223372036854775807"),
        step("SET z1 007"),
        step("SET z2 12345678901"),
        step("SET m 12345678901234567890"),
        args(&[b"SET", b"bin", &long_random]),
        step("SET big aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
        step("HSET h1 f v"),
        step("HSET h2 a 1 b -5 c 300 d 70000 e 9000000 f 3000000000 g x"),
        step("HSET h3 k 1 long xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
        args(&[
            b"SET",
            b"fox",
            b"the quick brown fox jumps over the lazy dog the quick brown fox",
        ]),
        step("SET abc abcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabc"),
        step("SET a21 aaaaaaaaaaaaaaaaaaaaa"),
        step("SET a24 aaaaaaaaaaaaaaaaaaaaaaaa"),
        step("HSET h4 field1 value value2 value value3 value value4 value"),
        step("SET t v"),
        step("PEXPIRE t 100000"),
        step("RPUSH l1 a b c 1 -2 300 70000"),
        step("ZADD zs1 1 a 2.5 b -3 c 1e300 d"),
        step("PEXPIRE zs1 200000"),
    ];
    // A list and a sorted set past the small encodings (skiplist form
    // for the zset, several quicklist nodes for the list).
    let mut big_list: Vec<Vec<u8>> = vec![b"RPUSH".to_vec(), b"l2".to_vec()];
    let mut big_zset: Vec<Vec<u8>> = vec![b"ZADD".to_vec(), b"zs2".to_vec()];
    for i in 0..400u32 {
        big_list.push(format!("element-{i}-{}", "x".repeat(i as usize % 90)).into_bytes());
        big_zset.push(format!("{}", f64::from(i) * 0.75 - 50.0).into_bytes());
        big_zset.push(format!("member-{i}").into_bytes());
    }
    let setup: Vec<Step> = setup
        .into_iter()
        .chain([
            Step {
                args: big_list,
                cmp: super::harness::Cmp::Exact,
            },
            Step {
                args: big_zset,
                cmp: super::harness::Cmp::Exact,
            },
        ])
        .collect();
    p.check(&step("FLUSHALL"), "flush");
    for s in &setup {
        p.check(s, "setup");
    }
    // Deterministic payloads: the same bytes.
    for k in [
        "s1", "s2", "i1", "i2", "i3", "i4", "i5", "i6", "z1", "z2", "m", "bin", "big", "fox",
        "abc", "a21", "a24", "h1", "h2", "h4", "t", "nokey",
    ] {
        p.check(&step(&format!("DUMP {k}")), "dump bytes");
    }
    // Every payload restores on the other server to the same value.
    for k in [
        "s1", "s2", "i1", "i4", "i6", "z1", "m", "bin", "big", "fox", "abc", "h1", "h2", "h3",
        "h4", "l1", "l2", "zs1", "zs2",
    ] {
        let dump = |c: &mut super::harness::Conn| match c.run(&[b"DUMP".to_vec(), k.into()]) {
            V::Bulk(b) => b,
            v => panic!("DUMP {k}: {v:?}"),
        };
        let (from_ours, from_theirs) = (dump(&mut p.ours), dump(&mut p.theirs));
        for (name, payload) in [("ours", from_ours), ("theirs", from_theirs)] {
            let dst = format!("r-{k}-{name}");
            p.check(
                &args(&[b"RESTORE", dst.as_bytes(), b"0", &payload]),
                "restore",
            );
            // h3 is a hash table in Redis (a value over 64 bytes): its
            // field order is the dict's, so it is compared as a multiset.
            let read = match k {
                "h3" => "@ HGETALL",
                k if k.starts_with('h') => "HGETALL",
                k if k.starts_with('l') => "LRANGE",
                k if k.starts_with("zs") => "ZRANGE",
                _ => "GET",
            };
            let tail = match read {
                "LRANGE" => " 0 -1",
                "ZRANGE" => " 0 -1 WITHSCORES",
                _ => "",
            };
            p.check(&step(&format!("{read} {dst}{tail}")), "restored value");
            p.check(&step(&format!("TYPE {dst}")), "restored type");
            p.check(&step(&format!("TTL {dst}")), "restored ttl");
        }
    }
    let good = match p.ours.run(&[b"DUMP".to_vec(), b"s1".to_vec()]) {
        V::Bulk(b) => b,
        v => panic!("{v:?}"),
    };
    let mut bad_crc = good.clone();
    *bad_crc.last_mut().unwrap() ^= 1;
    let mut bad_ver = good.clone();
    let n = bad_ver.len();
    bad_ver[n - 10] = 11;
    let mut list = vec![18u8, 0];
    list.extend_from_slice(&10u16.to_le_bytes());
    let crc = server::commands::dump::crc64(0, &list);
    list.extend_from_slice(&crc.to_le_bytes());
    let mut trunc = vec![0u8, 5, b'a'];
    trunc.extend_from_slice(&10u16.to_le_bytes());
    let crc = server::commands::dump::crc64(0, &trunc);
    trunc.extend_from_slice(&crc.to_le_bytes());
    let cases: Vec<Step> = vec![
        args(&[b"RESTORE", b"s1", b"0", &good]),
        args(&[b"RESTORE", b"s1", b"0", &good, b"REPLACE"]),
        args(&[b"RESTORE", b"n1", b"-1", &good]),
        args(&[b"RESTORE", b"n1", b"x", &good]),
        args(&[b"RESTORE", b"n1", b"0", &bad_crc]),
        args(&[b"RESTORE", b"n1", b"0", &bad_ver]),
        args(&[b"RESTORE", b"n1", b"0", b"short"]),
        args(&[b"RESTORE", b"n1", b"0", b""]),
        args(&[b"RESTORE", b"n1", b"0", &trunc]),
        args(&[b"RESTORE", b"n1", b"0", &list]),
        args(&[b"RESTORE", b"n1", b"0", &good, b"FOO"]),
        args(&[b"RESTORE", b"n1", b"0", &good, b"IDLETIME", b"-1"]),
        args(&[b"RESTORE", b"n1", b"0", &good, b"FREQ", b"256"]),
        args(&[b"RESTORE", b"n1", b"0", &good, b"FREQ", b"x"]),
        args(&[
            b"RESTORE",
            b"n1",
            b"0",
            &good,
            b"IDLETIME",
            b"5",
            b"FREQ",
            b"5",
        ]),
        args(&[b"RESTORE", b"n1", b"0", &good, b"IDLETIME"]),
        args(&[b"RESTORE", b"n1", b"0", &good, b"IDLETIME", b"100"]),
        args(&[b"RESTORE", b"n2", b"0", &good, b"FREQ", b"100"]),
        args(&[b"RESTORE", b"n3", b"100000", &good]),
        step("~1 TTL n3"),
        args(&[b"RESTORE", b"n4", b"4102444800000", &good, b"ABSTTL"]),
        step("PEXPIRETIME n4"),
        args(&[b"RESTORE", b"n5", b"1", &good, b"ABSTTL"]),
        step("EXISTS n5"),
        args(&[b"RESTORE", b"s1", b"1", &good, b"ABSTTL", b"REPLACE"]),
        step("EXISTS s1"),
        step("RESTORE n6 0"),
        step("DUMP"),
        step("DUMP a b"),
    ];
    for c in &cases {
        p.check(c, "restore cases");
    }
}

/// LZF as Redis writes it: DUMP of strings with repeats (small alphabets,
/// runs, copies at every distance up to 8 KiB and beyond) is the same
/// bytes on both servers.
#[test]
fn lzf_payloads_match_redis() {
    let Some(mut p) = Pair::start("lzf_payloads_match_redis") else {
        return;
    };
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for i in 0..150 {
        let len = match i % 3 {
            0 => 21 + rnd(60),
            1 => 80 + rnd(600),
            _ => 2000 + rnd(20000),
        } as usize;
        let alphabet = 1 + rnd(if i % 2 == 0 { 4 } else { 200 });
        let mut v: Vec<u8> = Vec::with_capacity(len);
        while v.len() < len {
            match rnd(4) {
                // A copy of earlier bytes, near or far.
                0 if v.len() > 10 => {
                    let from = rnd(v.len() as u64) as usize;
                    let n = (3 + rnd(300) as usize).min(v.len() - from);
                    let chunk = v[from..from + n].to_vec();
                    v.extend_from_slice(&chunk);
                }
                // A run.
                1 => {
                    let b = b'a'.wrapping_add(rnd(alphabet) as u8);
                    v.extend(std::iter::repeat_n(b, 1 + rnd(40) as usize));
                }
                _ => v.push(b'a'.wrapping_add(rnd(alphabet) as u8)),
            }
        }
        v.truncate(len);
        let key = format!("z{i}");
        p.check(&args(&[b"SET", key.as_bytes(), &v]), "set");
        p.check(&step(&format!("DUMP {key}")), &format!("lzf {len} bytes"));
    }
}
