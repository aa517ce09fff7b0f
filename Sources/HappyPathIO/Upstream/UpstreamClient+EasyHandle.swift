internal import CCurl
internal import CShims
import HappyPathCore

#if canImport(Glibc)
    import Glibc
#endif

/// A pooled libcurl easy handle with its error buffer and the nodes of its
/// header list. The nodes are ours (libcurl only reads a list): each try
/// points them at the fields of its `HeaderBlock`, so building the list
/// allocates nothing.
final class EasyHandle {
    let easy: UnsafeMutableRawPointer
    let errorBuffer: UnsafeMutablePointer<CChar>
    private(set) var nodes: UnsafeMutablePointer<curl_slist>
    private(set) var nodeCapacity: Int
    /// `Name: value` of each replacing field (`UpstreamRequest.replacing`,
    /// `replacingAlso`), NUL-terminated.
    private var replacements: [(entry: UnsafeMutablePointer<CChar>?, capacity: Int)] = [(nil, 0), (nil, 0)]
    /// The TLS settings and connect-to entry this handle was last given.
    var tls: UpstreamTLS?
    var connectTo: String?
    var connectToList: UnsafeMutablePointer<curl_slist>?

    init(easy: UnsafeMutableRawPointer) {
        self.easy = easy
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE))
        errorBuffer[0] = 0
        nodeCapacity = 16
        nodes = .allocate(capacity: nodeCapacity)
    }

    func reserveNodes(_ count: Int) {
        guard count > nodeCapacity else { return }
        nodes.deallocate()
        nodeCapacity = max(count, nodeCapacity * 2)
        nodes = .allocate(capacity: nodeCapacity)
    }

    /// The entry of replacing field number `slot` (0 or 1), written into that slot's buffer.
    func replacementEntry(_ field: HTTPField, slot: Int) -> UnsafeMutablePointer<CChar> {
        var name = field.name
        var value = field.value
        let length = name.utf8.count + value.utf8.count + 3
        if length > replacements[slot].capacity {
            replacements[slot].entry?.deallocate()
            replacements[slot] = (.allocate(capacity: max(length, 256)), max(length, 256))
        }
        let entry = replacements[slot].entry!
        let out = UnsafeMutableRawPointer(entry)
        var i = 0
        name.withUTF8 {
            out.copyMemory(from: $0.baseAddress!, byteCount: $0.count); i = $0.count
        }
        out.storeBytes(of: 0x3A, toByteOffset: i, as: UInt8.self)
        out.storeBytes(of: 0x20, toByteOffset: i + 1, as: UInt8.self)
        i += 2
        value.withUTF8 { v in
            if v.count > 0 { (out + i).copyMemory(from: v.baseAddress!, byteCount: v.count) }
            i += v.count
        }
        out.storeBytes(of: 0, toByteOffset: i, as: UInt8.self)
        return entry
    }

    func free() {
        curl_easy_cleanup(easy)
        if let connectToList { curl_slist_free_all(connectToList) }
        errorBuffer.deallocate()
        nodes.deallocate()
        for r in replacements { r.entry?.deallocate() }
    }
}

// MARK: - Setting up a try's handle

extension UpstreamClient {
    /// Points a pooled handle at `request`: its URL and target, method and
    /// body, header list, TLS settings, connect-to entry and time limits.
    /// Every option a previous try may have set is set again (or reset).
    func prepare(_ handle: EasyHandle, for request: UpstreamRequest) {
        let easy = handle.easy
        handle.errorBuffer[0] = 0

        // withCString: no temporary copy for native strings (libcurl copies them).
        if let url = parsedOrigin(request.origin) {
            hp_easy_set_ptr(easy, CURLOPT_CURLU, UnsafeRawPointer(url))
        } else {
            // Not parseable ahead: libcurl reports the problem on the try.
            hp_easy_set_ptr(easy, CURLOPT_CURLU, nil)
            request.origin.withCString { _ = hp_easy_set_ptr(easy, CURLOPT_URL, $0) }
        }
        request.target.withCString { _ = hp_easy_set_ptr(easy, CURLOPT_REQUEST_TARGET, $0) }
        // Method and body. HTTPGET resets whatever the previous try set.
        hp_easy_set_long(easy, CURLOPT_HTTPGET, 1)
        hp_easy_set_ptr(easy, CURLOPT_CUSTOMREQUEST, nil)
        if request.method == "HEAD" {
            hp_easy_set_long(easy, CURLOPT_NOBODY, 1)
        } else if let whole = request.bodyStream?.completeBody {
            // A streamed body that ended before this try: sent whole, with its length (libcurl
            // 7.88 can lose an HTTP/2 answer's head that arrives between the last DATA it read
            // and the read that finds the end; a whole body has no such read).
            hp_easy_set_off(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(whole.count))
            hp_easy_set_ptr(easy, CURLOPT_POSTFIELDS, whole.baseAddress ?? UnsafeRawPointer(emptyBody))
            if request.method != "POST" { request.method.withCString { _ = hp_easy_set_ptr(easy, CURLOPT_CUSTOMREQUEST, $0) } }
        } else if let stream = request.bodyStream {
            // Read as it streams (`upstreamReadCallback`), its length the client's if it gave one.
            hp_easy_set_ptr(easy, CURLOPT_POSTFIELDS, nil)
            hp_easy_set_long(easy, CURLOPT_POST, 1)
            hp_easy_set_off(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(stream.declaredLength ?? -1))
            if request.method != "POST" { request.method.withCString { _ = hp_easy_set_ptr(easy, CURLOPT_CUSTOMREQUEST, $0) } }
        } else if request.sendsBody {
            hp_easy_set_off(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(request.body.count))
            // libcurl reads the body in place: `transfer.body` keeps it alive.
            hp_easy_set_ptr(easy, CURLOPT_POSTFIELDS, request.body.baseAddress ?? emptyBody)
            if request.method != "POST" { request.method.withCString { _ = hp_easy_set_ptr(easy, CURLOPT_CUSTOMREQUEST, $0) } }
        } else if request.method != "GET" {
            request.method.withCString { _ = hp_easy_set_ptr(easy, CURLOPT_CUSTOMREQUEST, $0) }
        }

        hp_easy_set_ptr(easy, CURLOPT_HTTPHEADER, headerList(handle, request))
        // Only an upstream with `tls:` (or a handle that served one) pays for this.
        if request.tls !== handle.tls { apply(request.tls, to: handle) }
        if request.connectTo != handle.connectTo { connect(handle, to: request.connectTo) }

        // Less than one byte a second for idleTimeout: the upstream stalled.
        // (libcurl does not apply this while the transfer is paused.)
        hp_easy_set_long(easy, CURLOPT_LOW_SPEED_LIMIT, 1)
        hp_easy_set_long(easy, CURLOPT_LOW_SPEED_TIME, max(1, Int(request.idleTimeout.nanoseconds / 1_000_000_000)))
        hp_easy_set_long(easy, CURLOPT_CONNECTTIMEOUT_MS, max(1, Int(request.connectTimeout.millisecondsRoundedUp)))
    }

    /// The try's header list, in the handle's own nodes: the fields of the
    /// block (those named like a replacing field left out), the replacing
    /// fields, and "Name:" entries that stop libcurl from inventing `Accept`,
    /// `Expect` and `Content-Type`.
    func headerList(_ handle: EasyHandle, _ request: UpstreamRequest) -> UnsafeMutablePointer<curl_slist> {
        handle.reserveNodes(request.headers.fieldCount + 5)
        let nodes = handle.nodes
        var n = 0
        var sawAccept = false
        var sawContentType = false
        let replacing = request.replacing
        let replacingAlso = request.replacingAlso
        func replaced(_ name: UnsafeRawBufferPointer, by field: HTTPField?) -> Bool {
            guard var replaced = field?.name else { return false }
            return replaced.withUTF8 { HTTPBytes.equalsIgnoringCase(name, UnsafeRawBufferPointer($0)) }
        }
        request.headers.forEach { name, _, entry in
            switch name.count {
            case 6 where HTTPBytes.equals(name, "accept"): sawAccept = true
            case 12 where HTTPBytes.equals(name, "content-type"): sawContentType = true
            default: break
            }
            if replacing != nil, replaced(name, by: replacing) { return }
            if replacingAlso != nil, replaced(name, by: replacingAlso) { return }
            nodes[n].data = UnsafeMutablePointer(mutating: entry)
            n += 1
        }
        if let field = replacing {
            nodes[n].data = handle.replacementEntry(field, slot: 0)
            n += 1
        }
        if let field = replacingAlso {
            nodes[n].data = handle.replacementEntry(field, slot: 1)
            n += 1
        }
        if !sawAccept {
            nodes[n].data = blankAccept
            n += 1
        }
        if request.sendsBody {
            nodes[n].data = blankExpect
            n += 1
            if !sawContentType {
                nodes[n].data = blankContentType
                n += 1
            }
        }
        for i in 0..<n { nodes[i].next = i + 1 < n ? nodes + i + 1 : nil }
        return nodes
    }

    /// What every handle of the proxy's has, a try's or an upgrade's:
    /// no signals, no Nagle, HTTP/1.1 (also by ALPN), its error buffer, and
    /// upstreams reached directly: no `http_proxy` from the environment,
    /// and no proxy for any host (which also spares libcurl reading
    /// `no_proxy` and `NO_PROXY` from the environment on every transfer).
    static func configureCommon(_ easy: UnsafeMutableRawPointer, errorBuffer: UnsafeMutablePointer<CChar>) {
        hp_easy_set_long(easy, CURLOPT_NOSIGNAL, 1)
        hp_easy_set_long(easy, CURLOPT_TCP_NODELAY, 1)
        hp_easy_set_long(easy, CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_1_1))
        hp_easy_set_ptr(easy, CURLOPT_ERRORBUFFER, errorBuffer)
        "".withCString { _ = hp_easy_set_ptr(easy, CURLOPT_PROXY, $0) }
        "*".withCString { _ = hp_easy_set_ptr(easy, CURLOPT_NOPROXY, $0) }
    }

    func makeHandle() -> EasyHandle {
        let easy = curl_easy_init()!
        let handle = EasyHandle(easy: easy)
        Self.configureCommon(easy, errorBuffer: handle.errorBuffer)
        hp_easy_set_long(easy, CURLOPT_PATH_AS_IS, 1)
        hp_easy_set_long(easy, CURLOPT_HTTP_CONTENT_DECODING, 0)
        // libcurl's own default, set here so that it stays a choice: each
        // transfer in flight holds a read buffer of this size, and a paused
        // one (a client slower than its upstream) one read more. At 64 KiB
        // 1,000 stalled HTTP/2 streams held 143 MiB, at 16 KiB 66 MiB
        // (docs/http2.md, "Memory"); a larger body takes more, smaller reads.
        hp_easy_set_long(easy, CURLOPT_BUFFERSIZE, 16 * 1024)
        hp_easy_set_closesocket_cb(easy, upstreamCloseSocketCallback)
        // Alive: libcurl keeps this pointer with each connection the handle opens; those live in this
        // client's multi handle, which `shutdown()` cleans up (closing them) while the client is still there.
        hp_easy_set_ptr(easy, CURLOPT_CLOSESOCKETDATA, Unmanaged.passUnretained(self).toOpaque())
        hp_easy_set_write_cb(easy, CURLOPT_HEADERFUNCTION, upstreamHeaderCallback)
        hp_easy_set_write_cb(easy, CURLOPT_WRITEFUNCTION, upstreamWriteCallback)
        // Called only for a streamed body (no POSTFIELDS): `READDATA` is set by such a try.
        hp_easy_set_write_cb(easy, CURLOPT_READFUNCTION, upstreamReadCallback)
        return handle
    }

    func apply(_ tls: UpstreamTLS?, to handle: EasyHandle) {
        Self.apply(tls, to: handle.easy, defaultCA: Self.libcurlDefaultCA)
        handle.tls = tls
    }

    /// An upstream's `tls` on a handle. A handle that served another
    /// upstream gets libcurl's own CAs back (`libcurlDefaultCA`); a fresh one
    /// (nil) has them already.
    static func apply(
        _ tls: UpstreamTLS?, to easy: UnsafeMutableRawPointer, defaultCA: (file: String?, path: String?)?
    ) {
        func set(_ option: CURLoption, _ value: String?) {
            if let value {
                value.withCString { _ = hp_easy_set_ptr(easy, option, $0) }
            } else {
                hp_easy_set_ptr(easy, option, nil)
            }
        }
        if let ca = tls?.ca {
            // Only these CAs: not the system's folder beside them.
            set(CURLOPT_CAINFO, ca)
            set(CURLOPT_CAPATH, nil)
        } else if let defaultCA {
            set(CURLOPT_CAINFO, defaultCA.file)
            set(CURLOPT_CAPATH, defaultCA.path)
        }
        let verify = tls?.verify ?? true
        hp_easy_set_long(easy, CURLOPT_SSL_VERIFYPEER, verify ? 1 : 0)
        hp_easy_set_long(easy, CURLOPT_SSL_VERIFYHOST, verify ? 2 : 0)
        set(CURLOPT_SSLCERT, tls?.clientCert)
        set(CURLOPT_SSLKEY, tls?.clientKey)
    }

    func connect(_ handle: EasyHandle, to entry: String?) {
        if let old = handle.connectToList { curl_slist_free_all(old) }
        handle.connectToList = entry.flatMap { e in e.withCString { curl_slist_append(nil, $0) } }
        hp_easy_set_ptr(handle.easy, CURLOPT_CONNECT_TO, handle.connectToList.map { UnsafeRawPointer($0) })
        handle.connectTo = entry
    }
}

// "Name:" with nothing after it tells libcurl not to send a field it would add.
nonisolated(unsafe) private let blankAccept = strdup("Accept:")!
nonisolated(unsafe) private let blankExpect = strdup("Expect:")!
nonisolated(unsafe) private let blankContentType = strdup("Content-Type:")!
nonisolated(unsafe) private let emptyBody: UnsafeMutableRawPointer = UnsafeMutableRawPointer.allocate(byteCount: 1, alignment: 1)
