//! What the benchmarks share.

/// A temporary directory for a benchmark's pool: on `/dev/shm` (memory, as persistent
/// memory would be) where it exists, else in `/tmp`.
pub fn pool_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
        .expect("temporary directory")
}

/// The settings of the transaction benchmarks (`read_tx`, `large_read`): short runs,
/// whose spread criterion reports.
#[allow(dead_code)] // not every benchmark that shares this module uses it
pub fn short_runs() -> criterion::Criterion {
    criterion::Criterion::default()
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(2))
        .sample_size(10)
}
