internal import CCurl
internal import CShims
import HappyPathCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Sends finished spans to an OpenTelemetry collector over OTLP/HTTP
/// (protobuf), from a thread of its own: workers hand spans over with
/// `submit`, which takes a lock for an append and never waits for the
/// network. The queue is bounded: when it is full (the collector is slow
/// or gone), new spans are dropped and counted, never the worker's time.
/// Every `interval`, or as soon as `batch` spans wait, the thread encodes
/// them (`OTLPEncoder`) and POSTs them with a libcurl easy handle of its
/// own (a 5 s limit per export); a failed export drops its spans (counted).
///
/// `stop` has one total budget (`flushBudget`, 2 s): the export running
/// when it is called and the last ones share it, and what is not sent by
/// then is dropped (counted in `dropped` and `droppedAtStop`). A collector
/// that takes the connection and never answers cannot hold the process
/// past Kubernetes' grace period (with 5 s per export and a full queue of
/// eight batches, it held a SIGTERM for 37 s before). The export is driven
/// through a curl multi handle so that `stop` can wake it
/// (`curl_multi_wakeup`) instead of waiting for its own limit.
///
/// The spans wait in a `JobQueue` (bounded by `maxQueue`, its one thread
/// the exporter's); the easy handle is a local of that thread's loop.
public final class OTLPExporter: Sendable {
    public let endpoint: String
    private let serviceName: String
    private let version: String
    private let batch: Int
    private let interval: Duration

    /// Spans waiting for the exporter thread, which is the queue's.
    private let queue: JobQueue<Span>
    /// Set by `stop`: the end of the flush budget (monotonic nanoseconds).
    private let flushDeadline = Atomic<Int64>(.max)
    /// The exporter thread's multi handle, for `stop` to wake its wait.
    /// `nonisolated(unsafe)`: a raw pointer is not `Sendable`; only the
    /// exporter thread drives the handle, and the one call from another
    /// thread, `curl_multi_wakeup` in `stop`, is the one libcurl documents
    /// as safe from any thread. Made in `init`, freed in `deinit`.
    nonisolated(unsafe) private let multi: UnsafeMutableRawPointer?
    /// The most `stop` waits for the last exports, the running one included.
    public let flushBudget: Duration

    /// Spans sent (the collector answered 2xx), dropped (queue full, or
    /// an export that failed), and exports that failed.
    public let exported = Atomic<Int>(0)
    public let dropped = Atomic<Int>(0)
    public let failedExports = Atomic<Int>(0)
    /// Of `dropped`: spans not sent because the flush budget at stop ran out.
    public let droppedAtStop = Atomic<Int>(0)

    public init(
        endpoint: String, serviceName: String, version: String, maxQueue: Int = 4096, batch: Int = 512,
        interval: Duration = .seconds(1), flushBudget: Duration = .seconds(2)
    ) {
        self.endpoint = endpoint
        self.serviceName = serviceName
        self.version = version
        queue = JobQueue(name: "otlp-exporter", capacity: maxQueue)
        self.batch = batch
        self.interval = interval
        self.flushBudget = flushBudget
        multi = curl_multi_init()
    }

    deinit {
        if let multi { curl_multi_cleanup(multi) }
    }

    public func start() {
        queue.start { [self] _ in run() }
    }

    /// Sends what is queued within `flushBudget` (the export running now
    /// included), drops the rest, then ends the thread.
    public func stop() {
        flushDeadline.store(Self.monotonicNanoseconds() + flushBudget.nanoseconds, ordering: .releasing)
        // An export waiting on the collector looks at the deadline now.
        if let multi { curl_multi_wakeup(multi) }
        queue.stop()
    }

    /// Hands spans over; drops them (counted) if the queue is full (or the
    /// exporter stopped).
    public func submit(_ spans: [Span]) {
        let taken = queue.push(contentsOf: spans)
        if taken < spans.count { dropped.wrappingAdd(spans.count - taken, ordering: .relaxed) }
    }

    private func run() {
        let easy = curl_easy_init()
        defer { curl_easy_cleanup(easy) }
        // Every `interval`, or as soon as `batch` spans wait.
        while let spans = queue.take(max: batch, .fill(within: interval.nanoseconds)) {
            guard !spans.isEmpty else { continue }
            if Self.monotonicNanoseconds() >= flushDeadline.load(ordering: .acquiring) {
                // The budget is spent: what is left is dropped, not sent.
                dropped.wrappingAdd(spans.count, ordering: .relaxed)
                droppedAtStop.wrappingAdd(spans.count, ordering: .relaxed)
                continue
            }
            send(spans, with: easy)
        }
    }

    static func monotonicNanoseconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }

    private func send(_ spans: [Span], with easy: UnsafeMutableRawPointer?) {
        guard let easy, let multi else {
            dropped.wrappingAdd(spans.count, ordering: .relaxed)
            return
        }
        let body = OTLPEncoder.exportRequest(spans, serviceName: serviceName, version: version)
        var headers: UnsafeMutablePointer<curl_slist>? = nil
        headers = curl_slist_append(headers, "Content-Type: application/x-protobuf")
        defer { curl_slist_free_all(headers) }
        let ok = body.withUnsafeBytes { raw -> Bool in
            hp_easy_set_ptr(easy, CURLOPT_URL, endpoint)
            hp_easy_set_long(easy, CURLOPT_POST, 1)
            hp_easy_set_ptr(easy, CURLOPT_POSTFIELDS, raw.baseAddress)
            hp_easy_set_off(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(raw.count))
            hp_easy_set_ptr(easy, CURLOPT_HTTPHEADER, headers)
            hp_easy_set_long(easy, CURLOPT_TIMEOUT_MS, 5000)
            hp_easy_set_long(easy, CURLOPT_NOSIGNAL, 1)
            hp_easy_set_write_cb(easy, CURLOPT_WRITEFUNCTION, { _, size, count, _ in size * count })
            guard perform(easy, on: multi) == .done(CURLE_OK) else { return false }
            var status = 0
            hp_easy_get_long(easy, CURLINFO_RESPONSE_CODE, &status)
            return (200..<300).contains(status)
        }
        if ok {
            exported.wrappingAdd(spans.count, ordering: .relaxed)
        } else {
            failedExports.wrappingAdd(1, ordering: .relaxed)
            dropped.wrappingAdd(spans.count, ordering: .relaxed)
            if Self.monotonicNanoseconds() >= flushDeadline.load(ordering: .acquiring) {
                droppedAtStop.wrappingAdd(spans.count, ordering: .relaxed)
            }
        }
    }

    enum Performed: Equatable {
        case done(CURLcode)
        /// Given up: the flush budget at stop ran out.
        case cutShort
    }

    /// `curl_easy_perform`, but on `multi`, so that the wait for the
    /// collector ends when the flush budget does (`stop` wakes the poll).
    private func perform(_ easy: UnsafeMutableRawPointer, on multi: UnsafeMutableRawPointer) -> Performed {
        guard curl_multi_add_handle(multi, easy) == CURLM_OK else { return .done(CURLE_FAILED_INIT) }
        defer { curl_multi_remove_handle(multi, easy) }
        var running: Int32 = 1
        while true {
            guard curl_multi_perform(multi, &running) == CURLM_OK else { return .done(CURLE_FAILED_INIT) }
            if running == 0 { break }
            let left = flushDeadline.load(ordering: .acquiring) - Self.monotonicNanoseconds()
            if left <= 0 { return .cutShort }
            // At most until the deadline (or 1 s, for a deadline set meanwhile: stop also wakes it).
            let wait = Int32(min(left / 1_000_000 + 1, 1000))
            curl_multi_poll(multi, nil, 0, wait, nil)
        }
        var remaining: Int32 = 0
        while let message = curl_multi_info_read(multi, &remaining) {
            if message.pointee.msg == CURLMSG_DONE { return .done(hp_msg_result(message)) }
        }
        return .done(CURLE_FAILED_INIT)
    }
}
