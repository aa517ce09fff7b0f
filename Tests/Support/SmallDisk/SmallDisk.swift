import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// A small filesystem of the test's own (a tmpfs of `bytes`), to fill up
/// and free again; unmounted when released. Mounting needs root (as the
/// tests and CI run): where it fails, `init` prints why and gives nil, and
/// the test stops there. Shared by the store's and the integration tests.
public final class SmallDisk {
    public let path: String
    public var filler: String { path + "/filler" }

    public init?(bytes: Int) {
        path = NSTemporaryDirectory() + "happypath-tmpfs-" + UUID().uuidString
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        if mount("tmpfs", path, "tmpfs", 0, "size=\(bytes),mode=0700") != 0 {
            print("skipped: cannot mount a tmpfs at \(path): \(String(cString: strerror(errno))) (needs root)")
            try? FileManager.default.removeItem(atPath: path)
            return nil
        }
    }

    deinit {
        // Lazily: a process still holding a file there (a proxy being
        // reaped) must not keep the mount.
        umount2(path, Int32(MNT_DETACH))
        try? FileManager.default.removeItem(atPath: path)
    }

    /// Writes the filler file until the filesystem says ENOSPC.
    public func fill() {
        let fd = open(filler, O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let chunk = [UInt8](repeating: 0x66, count: 4096)
        while chunk.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) > 0 {}
        while chunk.withUnsafeBytes({ write(fd, $0.baseAddress, 1) }) > 0 {}
    }

    /// Deletes the filler: the space is free again.
    public func free() { unlink(filler) }
}
