// Drives Debian's Chromium (playwright-core, no browser download) to the
// example page, and prints what the page shows as JSON. Fails on any
// console error, page error or Content-Security-Policy violation.
//
// Usage: node browser.mjs PAGE_URL SCREENSHOT.png
import { chromium } from 'playwright-core';

const [pageUrl, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--no-first-run', '--disable-quic', '--disable-sync'],
});
const problems = [];
try {
  const page = await browser.newPage({ viewport: { width: 900, height: 520 } });
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  await page.goto(pageUrl);
  await page.waitForSelector('body[data-done]', { timeout: 30000 });
  const shown = await page.evaluate(() => Object.fromEntries(
    ['hello', 'features', 'connect', 'error', 'log'].map((id) => [id, document.getElementById(id).textContent])));
  const png = await page.screenshot({ path: screenshot, fullPage: true });
  await page.goto('about:blank');
  const blank = await page.screenshot();
  console.log(JSON.stringify({ shown, problems, screenshotBytes: png.length, blankBytes: blank.length }));
} finally {
  await browser.close();
}
