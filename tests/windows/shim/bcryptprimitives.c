/* Test fixture only, never shipped (docs/platforms.md, Build and test on Linux).
 *
 * Rust's std on Windows imports ProcessPrng from bcryptprimitives.dll (Windows 10+). Wine 8
 * does not export it, so a Windows build of stallwatch cannot start under Wine. This DLL,
 * placed next to the .exe under test, provides ProcessPrng over RtlGenRandom
 * (advapi32!SystemFunction036), which Wine has. Built by scripts/test-windows with
 * x86_64-w64-mingw32-gcc. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG chunk = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!SystemFunction036(data, chunk)) {
            return FALSE;
        }
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
