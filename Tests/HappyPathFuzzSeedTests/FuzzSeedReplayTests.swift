// Every file in Tests/FuzzSeeds/<target>/ (the corpora and the inputs the
// fuzzers once crashed on) through its target's check, in an ordinary build:
// `make test` runs these in the plain, ThreadSanitizer and AddressSanitizer
// passes, without libFuzzer. Each input runs in a child process (an exit
// test), so an input that traps fails its own test, with the trap's message,
// and the others still run.
import Foundation
import FuzzConfigHarness
import FuzzConnectionHarness
import FuzzDifferentialHarness
import FuzzHTTP2ClientHarness
import FuzzRedisReplyHarness
import FuzzHTTP2Harness
import FuzzOutsideValuesHarness
import FuzzRequestParserHarness
import FuzzResponseHeadHarness
import Testing

/// Each fuzz target and its check: a new target (in the Makefile's
/// FUZZ_TARGETS, with a seed folder) is one more line here.
let harnesses: [String: @Sendable ([UInt8]) -> String] = [
    "FuzzRequestParser": RequestParserHarness.check,
    "FuzzResponseHead": ResponseHeadHarness.check,
    "FuzzDifferential": DifferentialHarness.check,
    "FuzzConfig": ConfigHarness.check,
    "FuzzConnection": ConnectionHarness.check,
    "FuzzOutsideValues": OutsideValuesHarness.check,
    "FuzzHTTP2": HTTP2Harness.check,
    "FuzzHTTP2Client": HTTP2ClientHarness.check,
    "FuzzRedisReply": RedisReplyHarness.check,
]

/// Tests/FuzzSeeds, found from this file's place in the repository.
let seedsFolder = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .appendingPathComponent("FuzzSeeds")

/// One input file: its target (the folder it is in) and its path under that folder.
struct Seed: Sendable, Codable, CustomTestStringConvertible {
    var target: String
    var name: String
    var path: String { seedsFolder.appendingPathComponent(target).appendingPathComponent(name).path }
    var testDescription: String { "\(target)/\(name)" }

    /// The seed folders (a folder may be a symbolic link to another target's).
    static func targets() -> [String] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: seedsFolder.path)) ?? []
        return names.filter { isDirectory(seedsFolder.appendingPathComponent($0).path) }.sorted()
    }

    /// Every file under every seed folder, in a stable order (libFuzzer reads
    /// the folders recursively too).
    static func all() -> [Seed] {
        targets().flatMap { target in
            let folder = seedsFolder.appendingPathComponent(target).resolvingSymlinksInPath().path
            let names = FileManager.default.subpaths(atPath: folder) ?? []
            return names.filter { !isDirectory(folder + "/" + $0) }.sorted().map { Seed(target: target, name: $0) }
        }
    }

    static func isDirectory(_ path: String) -> Bool {
        var directory: ObjCBool = false
        return FileManager.default.fileExists(atPath: path, isDirectory: &directory) && directory.boolValue
    }
}

/// Feeds `seed` to its target's check; traps (in the exit test's child) on a broken invariant.
func replayInThisProcess(_ seed: Seed) {
    guard let harness = harnesses[seed.target] else { fatalError("no check for \(seed.target) in FuzzSeedReplayTests.harnesses") }
    guard let bytes = FileManager.default.contents(atPath: seed.path) else { fatalError("cannot read \(seed.path)") }
    _ = harness([UInt8](bytes))
}

@Suite struct FuzzSeedReplayTests {
    @Test(arguments: Seed.all())
    func replay(_ seed: Seed) async {
        let passed = await #expect(processExitsWith: .success) { [seed] in replayInThisProcess(seed) } != nil
        guard !passed else { return }
        // A failed exit test keeps nothing of the child: run it again for the trap's message.
        let again = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) { [seed] in
            replayInThisProcess(seed)
        }
        if let again { Issue.record("\(seed):\n\(String(decoding: again.standardErrorContent, as: UTF8.self))") }
    }

    /// The seed folders, the checks here and the Makefile's FUZZ_TARGETS
    /// name the same targets, and no folder is empty: no seed goes unreplayed
    /// and no target is fuzzed without its seeds replayed.
    @Test func everyTargetIsReplayed() throws {
        let folders = Seed.targets()
        #expect(Set(folders) == Set(harnesses.keys))
        let makefile = try String(
            contentsOf: seedsFolder.deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Makefile"),
            encoding: .utf8)
        let lines = makefile.replacingOccurrences(of: "\\\n", with: " ").split(separator: "\n")
        let line = try #require(lines.first { $0.hasPrefix("FUZZ_TARGETS :=") })
        let listed = line.dropFirst("FUZZ_TARGETS :=".count).split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
        #expect(Set(listed) == Set(harnesses.keys))
        let seeds = Seed.all()
        for target in folders {
            #expect(seeds.contains { $0.target == target }, "no seeds for \(target)")
        }
    }
}

/// FuzzConfig changes one key at a time of a configuration that is valid as
/// written: if it were not, every input would only find the same problem.
@Test func theFuzzConfigTemplateIsValidAsWritten() {
    #expect(ConfigHarness.templateAsWritten() == "valid")
}
