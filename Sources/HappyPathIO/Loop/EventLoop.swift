internal import CCurl
internal import CLibevent
internal import CShims
import HappyPathCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// One libevent `event_base` driven by one thread. Everything that touches the
/// base runs on that thread; other threads hand work over with `execute`,
/// which wakes the loop through libevent's thread-safe `event_active`.
///
/// Ownership: every object that holds an event on this base (`LoopEvent`,
/// `LoopTimer`, `SignalWatcher`, servers and clients) holds the loop
/// strongly, so the base is freed only after the last of them. The pool
/// of idle `LoopEvent`s is the one reference back: `close()` drops it once
/// the loop has stopped.
///
/// `@unchecked Sendable`: its `var`s are the loop thread's (checked with
/// `assertInEventLoop` where it matters); other threads reach it only
/// through `execute` (a `Locked` inbox), `stop` and the atomics.
public final class EventLoop: @unchecked Sendable {
    let base: OpaquePointer
    private var wakeEvent: OpaquePointer?
    private let inbox = Locked<[@Sendable () -> Void]>([])
    private var thread: pthread_t?
    /// The thread running the loop (0: none yet). Set by that thread as it
    /// starts, before it runs anything; cleared when `run` returns.
    private let owner = Atomic<UInt>(0)
    /// Set by `start` before the thread exists: from then on only the
    /// owner is on the loop (until `run` returns).
    private let running = Atomic<Bool>(false)
    /// Idle `LoopEvent`s, reused so the hot path allocates no timers.
    fileprivate var eventPool: [LoopEvent] = []
    /// `LoopTimer`s armed and not yet fired: the loop owns them until then.
    fileprivate var armedTimers: [ObjectIdentifier: LoopTimer] = [:]
    /// libevent's asynchronous resolver on this loop (`resolver()`).
    private var dnsBase: OpaquePointer?

    /// Process-wide setup, once, before any loop or thread exists: libevent
    /// locking (for `event_active` across threads), curl's globals, SIGPIPE.
    public static func initializeLibraries() {
        _ = librariesInitialized
    }

    private static let librariesInitialized: Bool = {
        evthread_use_pthreads()
        curl_global_init(Int(CURL_GLOBAL_ALL))
        // Request bodies of 128 KiB and more get their own mappings, so the
        // memory of a burst of large uploads goes back to the system.
        hp_malloc_map_large_blocks(128 * 1024)
        signal(SIGPIPE, SIG_IGN)
        // Many connections in and out: raise the soft descriptor limit to the hard one.
        var limit = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        return true
    }()

    public init() {
        Self.initializeLibraries()
        let config = event_config_new()
        // Batches epoll_ctl changes made during one loop pass (a socket that
        // is disabled and re-enabled costs nothing): fewer system calls.
        event_config_set_flag(config, Int32(EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST.rawValue))
        base = event_base_new_with_config(config)!
        event_config_free(config)
        // Alive: the wake-up event points at `self` unretained; it fires
        // only inside `run()`, while whoever runs the loop (`start`'s thread)
        // holds it, and the loop frees the event in deinit.
        wakeEvent = event_new(base, -1, 0, eventLoopWakeCallback, Unmanaged.passUnretained(self).toOpaque())
    }

    deinit {
        // Nothing that holds an event on the base is left (each holds `self`).
        eventPool.removeAll()
        armedTimers.removeAll()
        if let wakeEvent { event_free(wakeEvent) }
        if let dnsBase { evdns_base_free(dnsBase, 0) }
        event_base_free(base)
    }

    /// libevent's asynchronous resolver on this loop (nameservers from
    /// /etc/resolv.conf, names from /etc/hosts), made on first use (the
    /// HTTP/2 client's first endpoint named by a host); it holds no socket
    /// while nothing is asked. It lives as long as the loop: a cancelled
    /// lookup's callback runs on a later pass and locks the resolver, so
    /// no client on the loop may free it. (At a shutdown there is no later
    /// pass: a lookup still in flight keeps its connection until the
    /// process ends.) On the loop's thread.
    func resolver() -> OpaquePointer? {
        if dnsBase == nil {
            dnsBase = evdns_base_new(base, EVDNS_BASE_INITIALIZE_NAMESERVERS | EVDNS_BASE_DISABLE_WHEN_INACTIVE)
        }
        return dnsBase
    }

    /// After `stop()` and `join()`: drops the idle pooled timers and cancels
    /// the armed `LoopTimer`s (both hold the loop, and a timer holds what its
    /// body captured), so the loop is freed once its last user lets go.
    public func close() {
        eventPool.removeAll()
        for timer in Array(armedTimers.values) { timer.cancel() }
        // Work handed over after the loop stopped never runs: drop it (it
        // may capture the loop's owner).
        inbox.withLock { $0.removeAll() }
    }

    /// Runs `task` on the loop's thread, soon. Safe from any thread.
    public func execute(_ task: @escaping @Sendable () -> Void) {
        inbox.withLock { $0.append(task) }
        event_active(wakeEvent, Int32(EV_READ), 0)
    }

    fileprivate func drainInbox() {
        let tasks = inbox.withLock { tasks -> [@Sendable () -> Void] in
            defer { tasks.removeAll(keepingCapacity: true) }
            return tasks
        }
        for task in tasks { task() }
    }

    /// Runs the loop on the calling thread until `stop()`.
    public func run() {
        owner.store(UInt(pthread_self()), ordering: .releasing)
        running.store(true, ordering: .releasing)
        event_base_loop(base, Int32(EVLOOP_NO_EXIT_ON_EMPTY))
        running.store(false, ordering: .releasing)
        owner.store(0, ordering: .releasing)
    }

    /// Whether the calling thread may touch what belongs to this loop: it
    /// is the loop's thread, or the loop is not running (it is being set
    /// up, or it has stopped), so whoever holds it is its only user.
    public var inEventLoop: Bool {
        guard running.load(ordering: .acquiring) else { return true }
        return owner.load(ordering: .acquiring) == UInt(pthread_self())
    }

    /// Stops a debug build (and the tests) when called off the loop's thread.
    /// Costs nothing in a release build.
    @inlinable
    public func assertInEventLoop(file: StaticString = #fileID, line: UInt = #line) {
        assert(inEventLoop, "touched off its event loop's thread", file: file, line: line)
    }

    /// Stops the process when called off the loop's thread, in every build
    /// (as swift-nio's `preconditionInEventLoop`): what `LoopBound` stands
    /// on. Two atomic loads and `pthread_self`.
    @inlinable
    public func preconditionInEventLoop(file: StaticString = #fileID, line: UInt = #line) {
        precondition(inEventLoop, "touched off its event loop's thread", file: file, line: line)
    }

    /// Starts a thread that runs the loop, named `name` (its first 15 bytes).
    public func start(name: String) {
        // Crosses to the new thread as a C argument, not as a Sendable value.
        final class Box {
            let loop: EventLoop
            let name: String
            init(_ loop: EventLoop, _ name: String) { (self.loop, self.name) = (loop, name) }
        }
        let box = Unmanaged.passRetained(Box(self, name)).toOpaque()
        // From now on the loop belongs to the new thread; until it records
        // itself as the owner, no thread passes `inEventLoop`.
        running.store(true, ordering: .releasing)
        var tid = pthread_t()
        let rc = pthread_create(
            &tid, nil,
            { arg in
                let box = Unmanaged<AnyObject>.fromOpaque(arg!).takeRetainedValue() as! Box
                // Seen in `top -H`, gdb and /proc/<pid>/task/*/comm (15 bytes kept).
                nameCurrentThread(box.name)
                box.loop.run()
                return nil
            }, box)
        precondition(rc == 0, "pthread_create failed: \(rc)")
        thread = tid
    }

    /// Asks the loop to return after the current pass. Safe from any thread.
    public func stop() {
        event_base_loopbreak(base)
        event_active(wakeEvent, Int32(EV_READ), 0)
    }

    /// Waits for the loop's thread to end.
    public func join() {
        if let thread { pthread_join(thread, nil) }
        thread = nil
    }

    // MARK: - Timers

    /// Calls `body` on the loop after `delay` (zero: on the next pass).
    @discardableResult
    public func schedule(after delay: Duration, _ body: @escaping () -> Void) -> LoopTimer {
        let timer = LoopTimer(loop: self, body: body)
        timer.arm(delay)
        return timer
    }
}

private func eventLoopWakeCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<EventLoop>.fromOpaque(arg!).takeUnretainedValue().drainInbox()
}

/// A one-shot timer on a loop. While armed, its loop owns it (the C
/// callback holds an unretained pointer), so dropping the handle is safe;
/// firing, `cancel()` or the loop's `close()` ends that.
public final class LoopTimer {
    private let loop: EventLoop
    private var event: OpaquePointer?
    private var body: (() -> Void)?
    private var armed = false

    init(loop: EventLoop, body: @escaping () -> Void) {
        self.loop = loop
        self.body = body
        event = event_new(loop.base, -1, 0, loopTimerCallback, nil)
    }

    fileprivate func arm(_ delay: Duration) {
        loop.armedTimers[ObjectIdentifier(self)] = self
        armed = true
        // Alive: from here until it fires or is cancelled, the loop's
        // `armedTimers` holds this timer; fire(), cancel() and the loop's
        // close() take it out only once the event ran or was deleted.
        event_assign(event, event_get_base(event), -1, 0, loopTimerCallback, Unmanaged.passUnretained(self).toOpaque())
        var tv = timeval(delay)
        event_add(event, &tv)
    }

    fileprivate func fire() {
        let body = self.body
        self.body = nil
        armed = false
        withExtendedLifetime(self) {
            loop.armedTimers[ObjectIdentifier(self)] = nil
            body?()
        }
    }

    public func cancel() {
        guard armed else { return }
        armed = false
        event_del(event)
        body = nil
        loop.armedTimers[ObjectIdentifier(self)] = nil
    }

    deinit { if let event { event_free(event) } }
}

private func loopTimerCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<LoopTimer>.fromOpaque(arg!).takeUnretainedValue().fire()
}

extension timeval {
    init(_ duration: Duration) { self.init(nanoseconds: duration.nanoseconds) }

    init(nanoseconds: Int64) {
        let ns = max(0, nanoseconds)
        self.init(tv_sec: Int(ns / 1_000_000_000), tv_usec: Int((ns % 1_000_000_000) / 1000))
    }
}

// MARK: - Pooled timers for the hot path

/// Receives a `LoopEvent`'s firing, on the loop's thread.
public protocol LoopEventTarget: AnyObject {
    func loopEventFired(_ event: LoopEvent)
}

/// A reusable one-shot timer taken from its loop's pool: no allocation per
/// use, no closure. The target is held unowned(unsafe) (a timer is taken
/// for every request): its owner must `disarm()` (or let it fire) and
/// `recycle()` it before the target goes away.
public final class LoopEvent {
    fileprivate let event: OpaquePointer
    fileprivate let loop: EventLoop
    /// Alive: the target holds the event it took and recycles it (deleted,
    /// `target` cleared) before it goes; a target freed still holding it takes
    /// the event along (deinit frees it), so the callback never reaches a freed target.
    public unowned(unsafe) var target: LoopEventTarget?
    /// Free for the owner's use (e.g. which of its timers this is).
    public var tag = 0

    fileprivate init(loop: EventLoop) {
        self.loop = loop
        event = event_new(loop.base, -1, 0, loopEventCallback, nil)
        // Alive: the event belongs to this object and deinit frees it; while
        // taken its target holds the object, while idle the loop's pool does.
        event_assign(event, loop.base, -1, 0, loopEventCallback, Unmanaged.passUnretained(self).toOpaque())
    }

    deinit { event_free(event) }

    public func arm(after delay: Duration) {
        var tv = timeval(delay)
        event_add(event, &tv)
    }

    /// The same, in nanoseconds (no `Duration` arithmetic on the hot path).
    public func arm(afterNanoseconds delay: Int64) {
        var tv = timeval(nanoseconds: delay)
        event_add(event, &tv)
    }

    public func disarm() { event_del(event) }

    /// Back to the pool.
    public func recycle() {
        event_del(event)
        target = nil
        loop.eventPool.append(self)
    }

    fileprivate func fire() { target?.loopEventFired(self) }
}

private func loopEventCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<LoopEvent>.fromOpaque(arg!).takeUnretainedValue().fire()
}

extension EventLoop {
    /// A timer from the pool (made on first use). On the loop's thread.
    public func takeEvent(target: LoopEventTarget, tag: Int = 0) -> LoopEvent {
        let event = eventPool.popLast() ?? LoopEvent(loop: self)
        event.target = target
        event.tag = tag
        return event
    }
}

// MARK: - Signals

/// A signal delivered on a loop (libevent turns it into an ordinary event).
/// Keep the handle: dropping it stops the delivery.
public final class SignalWatcher {
    private let loop: EventLoop
    private var event: OpaquePointer?
    private let handler: () -> Void

    public init(loop: EventLoop, signal signo: Int32, handler: @escaping () -> Void) {
        self.loop = loop
        self.handler = handler
        // Alive: the caller keeps the watcher (main.swift, until the process
        // exits); cancel(), or deinit when it is dropped without one, frees
        // the event before the watcher goes.
        event = event_new(
            loop.base, signo, Int16(EV_SIGNAL | EV_PERSIST), signalWatcherCallback,
            Unmanaged.passUnretained(self).toOpaque())
        event_add(event, nil)
    }

    fileprivate func fire() { handler() }

    /// A watcher dropped without `cancel()` takes its event with it (from
    /// any thread: the loop's base is thread-safe, `evthread_use_pthreads`),
    /// so no signal reaches freed memory.
    deinit { cancel() }

    /// From any thread: libevent's base is locked (`evthread_use_pthreads`)
    /// and `event_free` waits for a callback that is running.
    public func cancel() {
        if let event {
            event_del(event)
            event_free(event)
        }
        event = nil
    }
}

private func signalWatcherCallback(_: Int32, _: Int16, _ arg: UnsafeMutableRawPointer?) {
    Unmanaged<SignalWatcher>.fromOpaque(arg!).takeUnretainedValue().fire()
}
