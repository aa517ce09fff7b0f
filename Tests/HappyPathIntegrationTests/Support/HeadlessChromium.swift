import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Debian's `chromium`, headless: once to dump a page's DOM or take a
/// screenshot, or kept open on a page and asked questions in between
/// (`LivePage`, over the DevTools protocol on a pipe, driven by a small
/// Python script of the standard library alone).
enum HeadlessChromium {
    /// The browser, if installed (`make test-deps` installs it).
    static let path: String? = ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"]
        .first { FileManager.default.isExecutableFile(atPath: $0) }

    static let flags = ["--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-extensions"]

    /// Runs it on `url` with `arguments` after `--virtual-time-budget`
    /// (timers run ahead, so the page's script has run); its standard output.
    static func run(_ arguments: [String], url: String) throws -> String {
        let profile = NSTemporaryDirectory() + "happypath-chromium-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: profile) }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path!)
        process.arguments = flags + ["--user-data-dir=\(profile)", "--virtual-time-budget=4000"] + arguments + [url]
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        // Read while it runs (a DOM larger than the pipe would block it).
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(decoding: data, as: UTF8.self)
    }

    /// Width and height from a PNG's IHDR.
    static func pngSize(_ path: String) -> (width: Int, height: Int)? {
        guard let d = FileManager.default.contents(atPath: path), d.count > 24, d.starts(with: [0x89, 0x50, 0x4E, 0x47])
        else { return nil }
        let b = [UInt8](d)
        func be32(_ i: Int) -> Int { Int(b[i]) << 24 | Int(b[i + 1]) << 16 | Int(b[i + 2]) << 8 | Int(b[i + 3]) }
        return (be32(16), be32(20))
    }

    /// A page kept open in real time: `ready` (a JavaScript expression) is
    /// waited for, then the test acts, then `after` is waited for; each
    /// wait answers with the values of `report` (expressions) as text.
    final class LivePage {
        let process = Process()
        private let input = Pipe()
        private let output = Pipe()
        private let profile = NSTemporaryDirectory() + "happypath-chromium-" + UUID().uuidString

        /// `extraFlags`: more of chromium's flags (`--ignore-certificate-errors`).
        init(url: String, ready: String, report: [String], extraFlags: [String] = []) throws {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            let reportJSON = String(decoding: try JSONSerialization.data(withJSONObject: report), as: UTF8.self)
            process.arguments = ["-u", "-c", Self.driver, path!, url, profile, ready, reportJSON] + flags + extraFlags
            process.standardInput = input
            process.standardOutput = output
            process.standardError = FileHandle.nullDevice
            try process.run()
        }

        /// The next line the driver prints, as JSON: `met` (the condition
        /// came true within 15 s) and `report` (the values).
        func next() -> [String: Any] {
            var line = Data()
            while true {
                let byte = output.fileHandleForReading.readData(ofLength: 1)
                if byte.isEmpty || byte == Data([UInt8(ascii: "\n")]) { break }
                line.append(byte)
            }
            return (try? JSONSerialization.jsonObject(with: line)) as? [String: Any] ?? [:]
        }

        /// Waits for `condition` (a JavaScript expression) to come true.
        func wait(for condition: String) -> [String: Any] {
            input.fileHandleForWriting.write(Data((condition + "\n").utf8))
            return next()
        }

        deinit {
            // An empty line closes the browser; a driver stuck past 10 s is
            // stopped, and stops the browser with it.
            try? input.fileHandleForWriting.close()
            let deadline = Date().addingTimeInterval(10)
            while process.isRunning, Date() < deadline { usleep(50_000) }
            if process.isRunning { kill(process.processIdentifier, SIGTERM) }
            process.waitUntilExit()
            try? FileManager.default.removeItem(atPath: profile)
        }

        /// Starts chromium with `--remote-debugging-pipe` (it reads commands
        /// on fd 3 and answers on fd 4, each message JSON ended by a NUL),
        /// opens the page, and for the first condition and every line read
        /// on stdin after, polls it with `Runtime.evaluate` every 100 ms.
        static let driver = #"""
            import fcntl, json, os, signal, subprocess, sys, time
            chromium, url, profile, ready, report = sys.argv[1:6]
            report = json.loads(report)
            def high(fd):
                new = fcntl.fcntl(fd, fcntl.F_DUPFD, 20)
                os.close(fd)
                return new
            to_r, to_w = map(high, os.pipe())
            from_r, from_w = map(high, os.pipe())
            def child():
                os.dup2(to_r, 3)
                os.dup2(from_w, 4)
            browser = subprocess.Popen([chromium] + sys.argv[6:] + ["--user-data-dir=" + profile, "--remote-debugging-pipe",
                "--window-size=1280,900", "about:blank"], preexec_fn=child, close_fds=False,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            os.close(to_r)
            os.close(from_w)
            def stop(*_):
                browser.kill()
                browser.wait()
                sys.exit(1)
            signal.signal(signal.SIGTERM, stop)
            pending = b""
            last = 0
            def call(method, params, session=None):
                global pending, last
                last += 1
                message = {"id": last, "method": method, "params": params}
                if session:
                    message["sessionId"] = session
                os.write(to_w, json.dumps(message).encode() + b"\0")
                while True:
                    while b"\0" in pending:
                        one, _, pending = pending.partition(b"\0")
                        answer = json.loads(one)
                        if answer.get("id") == last:
                            return answer.get("result", {})
                    chunk = os.read(from_r, 65536)
                    if not chunk:
                        stop()
                    pending += chunk
            target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            call("Page.navigate", {"url": url}, session)
            def value(expression):
                result = call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
                return result.get("result", {}).get("value")
            condition = ready
            while condition:
                deadline = time.time() + 15
                met = False
                while time.time() < deadline and not met:
                    met = bool(value(condition))
                    if not met:
                        time.sleep(0.1)
                print(json.dumps({"met": met, "report": [value(r) for r in report]}), flush=True)
                condition = sys.stdin.readline().strip()
            call("Browser.close", {})
            browser.wait(10)
            """#
    }
}
