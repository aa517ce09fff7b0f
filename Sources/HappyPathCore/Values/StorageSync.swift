/// `storage.sync`: SQLite's `synchronous` in WAL mode, for the deliver-later store.
public enum StorageSync: String, Sendable, CaseIterable {
    /// fsync at every commit: an acknowledged request survives a power loss.
    case full
    /// Survives a crash of the process; a power loss may lose the last commits.
    case normal
}
