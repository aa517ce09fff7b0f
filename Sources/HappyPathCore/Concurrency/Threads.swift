#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A thread of its own running `body` (a store's writer or readers, the
/// trace exporter): what `body` captures stays alive until it returns.
/// Join it with `pthread_join`.
public func startThread(_ what: String, _ body: @escaping () -> Void) -> pthread_t {
    let box = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    var t = pthread_t()
    let rc = pthread_create(
        &t, nil,
        { raw in
            Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue().body()
            return nil
        }, box)
    precondition(rc == 0, "cannot start \(what): pthread_create failed (\(rc))")
    return t
}

private final class ThreadBody {
    let body: () -> Void
    init(_ body: @escaping () -> Void) { self.body = body }
}

/// Initializes `condition` to time its waits on the monotonic clock (a
/// wall-clock step must not end or stretch a wait), for `monotonicDeadline`.
public func initMonotonicCondition(_ condition: UnsafeMutablePointer<pthread_cond_t>) {
    var attributes = pthread_condattr_t()
    pthread_condattr_init(&attributes)
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
    pthread_cond_init(condition, &attributes)
    pthread_condattr_destroy(&attributes)
}

/// The monotonic time `nanoseconds` from now, for `pthread_cond_timedwait`
/// on a condition made by `initMonotonicCondition`.
public func monotonicDeadline(after nanoseconds: Int64) -> timespec {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    let end = Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec) + nanoseconds
    return timespec(tv_sec: Int(end / 1_000_000_000), tv_nsec: Int(end % 1_000_000_000))
}

/// Names the calling thread (`top -H`, `gdb`, ThreadSanitizer's reports).
/// Linux keeps 15 bytes of it. Through `/proc/thread-self/comm`, which is
/// what `pthread_setname_np` writes on Linux (Glibc's Swift module does not
/// declare that function: it needs `_GNU_SOURCE`).
public func nameCurrentThread(_ name: String) {
    #if canImport(Glibc)
        let fd = open("/proc/thread-self/comm", O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let bytes = Array(name.utf8.prefix(15))
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    #elseif canImport(Darwin)
        pthread_setname_np(String(decoding: name.utf8.prefix(63), as: UTF8.self))
    #endif
}

/// The calling thread's name, as `nameCurrentThread` set it ("" if unknown).
public func currentThreadName() -> String {
    #if canImport(Glibc)
        let fd = open("/proc/thread-self/comm", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return "" }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 64)
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { return "" }
        return String(decoding: buffer[..<n].prefix { $0 != 0x0A }, as: UTF8.self)
    #else
        var buffer = [CChar](repeating: 0, count: 64)
        pthread_getname_np(pthread_self(), &buffer, buffer.count)
        return String(cString: buffer)
    #endif
}
