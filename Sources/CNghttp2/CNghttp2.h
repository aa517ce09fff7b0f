// libnghttp2 (Debian libnghttp2-dev, 1.52.0-1+deb12u3 or later: that
// revision carries the Rapid Reset and CONTINUATION limits and the fix for
// CVE-2026-27135). Nothing else is needed: no variadic function is on our
// path, and the macros that do not import (the window sizes) are constants
// in Swift (docs/plans/http2.md, section 3).
#include <nghttp2/nghttp2.h>
