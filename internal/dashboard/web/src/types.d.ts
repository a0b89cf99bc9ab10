// Style sheets are imported for esbuild, which bundles them into the page's CSS file.
declare module '*.css';
