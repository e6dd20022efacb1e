//! Many small files in one session: every one completes (pipelining must not stall).
use hayate_proto::sim::{run, Scenario};

#[test]
fn two_thousand_small_uploads_all_complete() {
    let mut sc = Scenario::new(1);
    sc.uploads = (0..2000)
        .map(|i| (format!("f{i}"), vec![i as u8; 4096]))
        .collect();
    let r = run(&sc);
    assert_eq!(r.error, None);
    assert_eq!(r.server_files.len(), 2000);
}
