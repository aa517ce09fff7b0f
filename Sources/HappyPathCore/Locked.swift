#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A value behind a pthread mutex, for state that several threads share
/// (a breaker, a budget, a token, a loop's inbox). The proxy uses this
/// instead of `Synchronization.Mutex` because ThreadSanitizer understands
/// pthread locks: with `Mutex` (a futex on Linux) it cannot see the
/// critical sections and reports every access in them as a race, so real
/// races would be lost among false ones (`make sanitize`). Uncontended, a
/// lock and unlock cost about what `Mutex` costs. `@unchecked Sendable`:
/// the value is reached only through `withLock`, which holds the mutex.
public final class Locked<Value>: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var value: Value

    public init(_ value: Value) {
        self.value = value
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    /// Runs `body` with the value, the lock held.
    @inlinable
    public func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        lock()
        defer { unlock() }
        return try body(&valueStorage)
    }

    @usableFromInline func lock() { pthread_mutex_lock(mutex) }
    @usableFromInline func unlock() { pthread_mutex_unlock(mutex) }
    @usableFromInline var valueStorage: Value {
        get { value }
        _modify { yield &value }
    }
}

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
