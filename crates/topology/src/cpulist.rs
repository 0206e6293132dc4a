//! Kernel CPU range lists ("0-3,5,7-8") and the set of online CPUs.

use std::fmt;

use crate::affinity::allowed_cpus;

/// Where the kernel publishes the online CPUs as a range list.
pub const SYSFS_ONLINE_CPUS_PATH: &str = "/sys/devices/system/cpu/online";

/// Largest CPU id [`parse_cpu_list`] accepts. Linux caps `NR_CPUS` at 8192 on
/// every architecture we care about; the limit keeps a corrupt range such as
/// `0-18446744073709551615` from allocating the whole address space.
pub const CPU_LIST_MAX_CPU_ID: usize = (1 << 16) - 1;

/// Why a CPU range list could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// The list was empty (or only whitespace).
    Empty,
    /// Two commas with nothing between them, or a leading/trailing comma.
    EmptyElement {
        /// Zero-based position of the element in the comma-separated list.
        index: usize,
    },
    /// A token that is not a plain decimal number.
    InvalidNumber {
        /// The offending token.
        token: String,
    },
    /// A range whose start is larger than its end, e.g. `3-1`.
    ReversedRange {
        /// First number of the range.
        start: usize,
        /// Second number of the range.
        end: usize,
    },
    /// A CPU id above [`CPU_LIST_MAX_CPU_ID`].
    TooLarge {
        /// The offending CPU id.
        cpu: usize,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Empty => write!(f, "empty CPU list"),
            ParseError::EmptyElement { index } => {
                write!(f, "empty element at position {index} of CPU list")
            }
            ParseError::InvalidNumber { token } => {
                write!(f, "invalid CPU number {token:?} in CPU list")
            }
            ParseError::ReversedRange { start, end } => {
                write!(f, "reversed CPU range {start}-{end} (start > end)")
            }
            ParseError::TooLarge { cpu } => write!(
                f,
                "CPU id {cpu} exceeds the supported maximum {CPU_LIST_MAX_CPU_ID}"
            ),
        }
    }
}

impl std::error::Error for ParseError {}

fn parse_cpu_id(token: &str) -> Result<usize, ParseError> {
    // `usize::from_str` would accept "+3"; the kernel format is digits only.
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::InvalidNumber {
            token: token.to_owned(),
        });
    }
    let cpu: usize = token.parse().map_err(|_| ParseError::InvalidNumber {
        token: token.to_owned(),
    })?;
    if cpu > CPU_LIST_MAX_CPU_ID {
        return Err(ParseError::TooLarge { cpu });
    }
    Ok(cpu)
}

/// Parses a kernel CPU range list such as `"0-3,5,7-8"` (the format of
/// `/sys/devices/system/cpu/online` and `.../node*/cpulist`).
///
/// Surrounding whitespace (the trailing newline of a sysfs file) is ignored.
/// The result is sorted and free of duplicates, so overlapping or unordered
/// elements are accepted. An empty list is an error; callers reading a
/// CPU-less NUMA node's `cpulist` (which is legitimately empty) must check for
/// that themselves.
pub fn parse_cpu_list(list: &str) -> Result<Vec<usize>, ParseError> {
    let list = list.trim();
    if list.is_empty() {
        return Err(ParseError::Empty);
    }
    let mut cpus = Vec::new();
    for (index, element) in list.split(',').enumerate() {
        let element = element.trim();
        if element.is_empty() {
            return Err(ParseError::EmptyElement { index });
        }
        match element.split_once('-') {
            None => cpus.push(parse_cpu_id(element)?),
            Some((start, end)) => {
                let start = parse_cpu_id(start.trim())?;
                let end = parse_cpu_id(end.trim())?;
                if start > end {
                    return Err(ParseError::ReversedRange { start, end });
                }
                cpus.extend(start..=end);
            }
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Formats CPU ids as a compact kernel-style range list (`[0,1,2,5]` ->
/// `"0-2,5"`). The input need not be sorted; duplicates are ignored. An empty
/// input gives an empty string.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

/// The CPUs the kernel currently has online, sorted.
///
/// Reads [`SYSFS_ONLINE_CPUS_PATH`]. If sysfs is missing or unreadable (some
/// containers), falls back to the calling thread's affinity mask, and if even
/// that fails, to `0..available_parallelism()`. Reads sysfs on every call; use
/// [`crate::topology()`] for a cached view.
pub fn online_cpus() -> Vec<usize> {
    if let Some(cpus) = std::fs::read_to_string(SYSFS_ONLINE_CPUS_PATH)
        .ok()
        .and_then(|s| parse_cpu_list(&s).ok())
    {
        return cpus;
    }
    let allowed = allowed_cpus();
    if !allowed.is_empty() {
        return allowed;
    }
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_examples() {
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert_eq!(parse_cpu_list("0-1\n").unwrap(), vec![0, 1]);
        assert_eq!(
            parse_cpu_list("0-3,5,7-8").unwrap(),
            vec![0, 1, 2, 3, 5, 7, 8]
        );
        assert_eq!(parse_cpu_list("  4-4 ").unwrap(), vec![4]);
        assert_eq!(parse_cpu_list("1022-1023").unwrap(), vec![1022, 1023]);
    }

    #[test]
    fn unordered_and_overlapping_elements_are_normalised() {
        assert_eq!(parse_cpu_list("7,0-2,1-3,2").unwrap(), vec![0, 1, 2, 3, 7]);
    }

    #[test]
    fn rejects_malformed_lists() {
        assert_eq!(parse_cpu_list(""), Err(ParseError::Empty));
        assert_eq!(parse_cpu_list(" \n"), Err(ParseError::Empty));
        assert_eq!(
            parse_cpu_list("a-b"),
            Err(ParseError::InvalidNumber { token: "a".into() })
        );
        assert_eq!(
            parse_cpu_list("3-1"),
            Err(ParseError::ReversedRange { start: 3, end: 1 })
        );
        assert_eq!(
            parse_cpu_list("1,,2"),
            Err(ParseError::EmptyElement { index: 1 })
        );
        assert_eq!(
            parse_cpu_list("1,"),
            Err(ParseError::EmptyElement { index: 1 })
        );
        assert_eq!(
            parse_cpu_list("-3"),
            Err(ParseError::InvalidNumber { token: "".into() })
        );
        assert_eq!(
            parse_cpu_list("+3"),
            Err(ParseError::InvalidNumber { token: "+3".into() })
        );
        assert_eq!(
            parse_cpu_list("1-2-3"),
            Err(ParseError::InvalidNumber {
                token: "2-3".into()
            })
        );
        assert_eq!(
            parse_cpu_list("0-7:2/4"),
            Err(ParseError::InvalidNumber {
                token: "7:2/4".into()
            })
        );
        assert_eq!(
            parse_cpu_list("0-99999999999999999999999"),
            Err(ParseError::InvalidNumber {
                token: "99999999999999999999999".into()
            })
        );
        assert_eq!(
            parse_cpu_list("0-70000"),
            Err(ParseError::TooLarge { cpu: 70000 })
        );
        // Display is human readable and names the culprit.
        assert!(parse_cpu_list("3-1")
            .unwrap_err()
            .to_string()
            .contains("3-1"));
    }

    #[test]
    fn formats_compact_lists() {
        assert_eq!(format_cpu_list(&[]), "");
        assert_eq!(format_cpu_list(&[3]), "3");
        assert_eq!(format_cpu_list(&[5, 0, 1, 2, 2, 7, 8]), "0-2,5,7-8");
    }

    /// Tiny deterministic generator (xorshift64*) so the model test needs no
    /// dev-dependency.
    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Model test: for random CPU sets, both the canonical rendering and a
    /// scrambled rendering (shuffled, overlapping ranges, duplicates) parse
    /// back to exactly the model set.
    #[test]
    fn model_random_sets_round_trip() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2000 {
            let universe = 1 + rng.below(300) as usize;
            let density = 1 + rng.below(100);
            let model: Vec<usize> = (0..universe).filter(|_| rng.below(100) < density).collect();
            if model.is_empty() {
                continue;
            }

            let canonical = format_cpu_list(&model);
            assert_eq!(parse_cpu_list(&canonical).unwrap(), model, "{canonical}");

            // Scrambled: split the set into random runs, render each run as
            // a range (sometimes widened to overlap a neighbour that is also
            // in the set), add duplicates, and shuffle the elements.
            let mut elements = Vec::new();
            let mut i = 0;
            while i < model.len() {
                let run = 1 + rng.below(4) as usize;
                let mut j = i;
                while j + 1 < model.len() && j + 1 - i < run && model[j + 1] == model[j] + 1 {
                    j += 1;
                }
                if i == j {
                    elements.push(model[i].to_string());
                } else {
                    elements.push(format!("{}-{}", model[i], model[j]));
                }
                if rng.below(4) == 0 {
                    elements.push(model[j].to_string());
                }
                i = j + 1;
            }
            for k in (1..elements.len()).rev() {
                let r = rng.below(k as u64 + 1) as usize;
                elements.swap(k, r);
            }
            let scrambled = elements.join(",");
            assert_eq!(parse_cpu_list(&scrambled).unwrap(), model, "{scrambled}");
        }
    }

    #[test]
    fn online_cpus_is_sorted_and_nonempty() {
        let cpus = online_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
    }
}
