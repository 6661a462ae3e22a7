//! The benchmark programs still do what their benchmarks measure: each
//! case of `filter-profile` answers as expected for a few requests, so that
//! `make bench-filter-profile` cannot rot between the rounds that run it.

use std::process::Command;

#[test]
fn filter_profile_answers_every_case() {
    for case in ["hello", "books", "book"] {
        let out = Command::new(env!("CARGO_BIN_EXE_filter-profile"))
            .args([case, "3"])
            .output()
            .expect("filter-profile runs");
        assert!(
            out.status.success(),
            "{case}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("3 requests of {case}")
        );
    }
}
