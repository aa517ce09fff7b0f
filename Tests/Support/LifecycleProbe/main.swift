// Starts and stops the real proxy many times in one process and reports
// whether anything was left behind: open descriptors, heap in use (glibc's
// `mallinfo2`) and resident memory, after a warm-up and after the cycles.
// Run by LifecycleTests in a process of its own, so no other test's
// sockets or allocations are counted.
//
//   LifecycleProbe CYCLES   → one JSON line on stdout
import CHeapProbe
import Foundation
import HappyPathConfig
import HappyPathDemo
import HappyPathServer
import Logging

#if canImport(Glibc)
    import Glibc
#endif

let cycles = CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1]) ?? 20 : 20

func openDescriptors() -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
}

func heapInUse() -> Int { Int(heap_probe_in_use()) }

func residentKiB() -> Int {
    let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
    for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        return Int(line.split(separator: " ")[1]) ?? -1
    }
    return -1
}

/// One request on its own connection (`Connection: close`); the status code, or -1.
func get(port: Int, _ target: String) -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard connected == 0 else { return -1 }
    let request = "GET \(target) HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n"
    _ = request.withCString { send(fd, $0, strlen($0), 0) }
    var response = [UInt8]()
    var buffer = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = recv(fd, &buffer, buffer.count, 0)
        if n <= 0 { break }
        response.append(contentsOf: buffer[0..<n])
    }
    let text = String(decoding: response.prefix(12), as: UTF8.self)
    return text.count >= 12 ? Int(text.dropFirst(9).prefix(3)) ?? -1 : -1
}

let demo = try DemoUpstream(host: "127.0.0.1", port: 0)
demo.start()
let yaml = """
    listen: 127.0.0.1:0
    admin: { listen: 127.0.0.1:0 }
    defaults:
      retry: { attempts: 2, backoff: { base: 1ms, max: 2ms }, honor_retry_after: false }
      health_check: { interval: 50ms }
    upstreams:
      demo: { endpoints: [http://127.0.0.1:\(demo.port)] }
    routes:
      - match: { path_prefix: / }
        upstream: demo
    """
let configuration = try ConfigLoader.parse(yaml, file: "probe.yaml", environment: [:])
let logger: Logger = {
    var l = Logger(label: "probe")
    l.logLevel = .critical
    return l
}()

/// One life of the proxy: started, a few requests of each kind (streamed,
/// retried and mapped, cut by the upstream), a reload, stopped.
func cycle() -> [Int] {
    let server = ProxyServer(configuration: configuration, workers: 2, logger: logger)
    try! server.start()
    var statuses: [Int] = []
    for target in ["/ok", "/ok", "/status/503", "/status/404", "/drop", "/bytes?n=200000", "/ok"] {
        statuses.append(get(port: server.port, target))
    }
    _ = server.reload(configuration)
    statuses.append(get(port: server.port, "/ok"))
    server.stop()
    return statuses
}

/// Descriptors once the demo upstream has closed its side of the proxy's
/// last connections (it sees their end a moment after the proxy stops):
/// waits up to 5 s for the count to come down to `target`.
func settledDescriptors(atMost target: Int) -> Int {
    for _ in 0..<250 {
        let n = openDescriptors()
        if n <= target { return n }
        usleep(20_000)
    }
    return openDescriptors()
}

for _ in 0..<3 { _ = cycle() }  // warm-up: lazily made globals, libcurl's caches, malloc's arenas
// Between lives the process holds its own descriptors and the demo's
// listener; the count is taken once it stops falling (200 ms unchanged).
var baseline = openDescriptors()
var unchanged = 0
while unchanged < 10 {
    usleep(20_000)
    let n = openDescriptors()
    unchanged = n == baseline ? unchanged + 1 : 0
    baseline = n
}
let before = (fds: baseline, heap: heapInUse(), rss: residentKiB())
var statuses: [Int] = []
for _ in 0..<cycles { statuses = cycle() }
let after = (fds: settledDescriptors(atMost: before.fds), heap: heapInUse(), rss: residentKiB())
demo.stop()
print(
    """
    {"cycles":\(cycles),"fds_before":\(before.fds),"fds_after":\(after.fds),\
    "heap_before":\(before.heap),"heap_after":\(after.heap),\
    "rss_kib_before":\(before.rss),"rss_kib_after":\(after.rss),\
    "last_statuses":\(statuses)}
    """)
