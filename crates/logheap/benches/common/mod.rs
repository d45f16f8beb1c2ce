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
