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
