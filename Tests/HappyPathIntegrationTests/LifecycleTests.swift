import Foundation
import Testing

/// Ownership holds up: a proxy started and stopped many times in one
/// process leaves nothing behind. Measured in a process of its own
/// (Tests/Support/LifecycleProbe), so the other tests running in parallel
/// here are not counted.
@Suite struct LifecycleTests {
    @Test func startingAndStoppingLeavesNothingBehind() throws {
        let directory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
        let probe = directory.appendingPathComponent("LifecycleProbe")
        try #require(
            FileManager.default.isExecutableFile(atPath: probe.path),
            "no \(probe.path): build it with `swift build --build-tests`")
        let process = Process()
        process.executableURL = probe
        process.arguments = ["100"]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        let report = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let number = { (key: String) in report[key] as? Int ?? -1 }
        // Every request of every life was answered as the proxy answers it.
        #expect(report["last_statuses"] as? [Int] == [200, 200, 503, 404, 503, 200, 200, 200])
        // Each life opens ~12 descriptors (listeners, epoll, wake-ups, upstream
        // connections) and allocates tens of KiB: all of it must be given back.
        // (Fewer is fine: a sanitizer's runtime may close what it opened lazily.)
        #expect(number("fds_after") <= number("fds_before"), "\(report)")
        // The heap may settle (allocator and library caches fill up once),
        // but 100 lives that each kept their workers would hold megabytes.
        #expect(number("heap_after") - number("heap_before") < 64 * 1024, "\(report)")
    }
}
